#include "runtime/checkpoint/save_interval.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace grace {

double estimate_mtbf(const failure_history& h, double prior_s, std::size_t window) {
  std::size_t n = std::min(window, h.gaps_s.size());
  double run = h.open_s;
  for (std::size_t i = h.gaps_s.size() - n; i < h.gaps_s.size(); ++i) run += h.gaps_s[i];
  if (n == 0) return prior_s + run;
  return run / double(n);
}

double daly_interval(double save_cost_s, double mtbf_s) {
  double c = std::max(save_cost_s, 0.0), m = std::max(mtbf_s, 1e-9);
  if (c >= 2 * m) return m;
  double r = std::sqrt(c / (2 * m));
  return std::sqrt(2 * c * m) * (1 + r / 3 + r * r / 9) - c;
}

double expected_wall_time(double work_s, double interval_s, double save_cost_s, double restart_s, double mtbf_s) {
  return mtbf_s * std::exp(restart_s / mtbf_s) * std::expm1((interval_s + save_cost_s) / mtbf_s) * work_s / interval_s;
}

failure_history read_failure_history(const std::string& path) {
  failure_history h;
  std::ifstream f(path);
  std::string line;
  bool open_start = false;
  auto fail = [&h] {
    h.gaps_s.push_back(h.open_s);
    h.open_s = 0;
  };
  while (std::getline(f, line)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) continue;
    if (j.value("start", false)) {
      if (open_start) fail();  // the previous incarnation never reported its end
      open_start = true;
      continue;
    }
    open_start = false;
    h.open_s += std::max(0.0, j.value("run_s", 0.0));
    if (j.value("failure", false)) fail();
  }
  return h;
}

namespace {
bool append_line(const std::string& dir, const nlohmann::json& j) {
  if (dir.empty()) return false;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  auto path = (std::filesystem::path(dir) / failure_history_file).string();
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  auto line = j.dump() + "\n";
  bool ok = ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  return ::close(fd) == 0 && ok;
}
}  // namespace

bool record_incarnation_start(const std::string& dir, uint32_t incarnation) {
  return append_line(dir, {{"start", true}, {"incarnation", incarnation}});
}

bool record_incarnation_end(const std::string& dir, uint32_t incarnation, double run_s, bool failure) {
  return append_line(dir, {{"incarnation", incarnation}, {"run_s", run_s}, {"failure", failure}});
}

void save_interval::on_save_cost(int64_t ns) {
  costs_.push_back(std::max<int64_t>(ns, 0));
  if (costs_.size() > 8) costs_.erase(costs_.begin());
}

double save_interval::mtbf_s() const {
  auto h = history_;
  h.open_s += running_s_;
  return estimate_mtbf(h, prior_s_);
}

double save_interval::cost_s() const {
  if (costs_.empty()) return 0;
  auto c = costs_;
  std::nth_element(c.begin(), c.begin() + c.size() / 2, c.end());
  return double(c[c.size() / 2]) / 1e9;
}

double save_interval::seconds() const { return costs_.empty() ? 0 : daly_interval(cost_s(), mtbf_s()); }

int64_t save_backoff::failed(int64_t now_ns) {
  int64_t d = delay_ns_;
  next_ns_ = now_ns + d;
  delay_ns_ = std::min(2 * delay_ns_, longest_ns_);
  ++failures_;
  return d;
}

void save_backoff::succeeded() {
  failures_ = 0;
  delay_ns_ = first_ns_;
}

}  // namespace grace
