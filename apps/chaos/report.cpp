#include "apps/chaos/report.hpp"

#include "apps/chaos/runner.hpp"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

namespace fs = std::filesystem;

namespace grace::chaos {

nlohmann::json make_report(const run_config& cfg, const run_result& res, const check_output& chk,
                           const nlohmann::json& extra) {
  nlohmann::json j = extra;
  j["config"] = {{"workers", cfg.workers},
                 {"steps", cfg.steps},
                 {"save_every", cfg.save_every},
                 {"step_delay_ms", cfg.step_delay_ms},
                 {"trainer_args", cfg.trainer_args},
                 {"trainer", cfg.trainer},
                 {"trainer_prefix", cfg.trainer_prefix},
                 {"launcher", cfg.launcher}};
  if (cfg.hosts >= 2) {
    j["config"]["hosts"] = cfg.hosts;
    j["config"]["dead_after_ms"] = cfg.dead_after_ms;
    j["config"]["etcd"] = cfg.etcd;
    j["config"]["node_local"] = cfg.node_local;
  }
  auto faults = nlohmann::json::array();
  for (size_t i = 0; i < res.faults.size(); ++i) {
    auto& f = res.faults[i];
    nlohmann::json fj = {{"index", f.index},
                         {"spec", to_json(f.f)},
                         {"status", f.status},
                         {"detail", f.detail},
                         {"t_ns", f.t_ns},
                         {"est_step", f.est_step},
                         {"launch", f.launch},
                         {"incarnation", f.incarnation},
                         {"ranks", f.ranks},
                         {"grace_ms", f.effective_grace_ms},
                         {"deadline_kill", f.deadline_kill}};
    if (!f.corrupted_path.empty()) fj["damaged_path"] = f.corrupted_path;
    if (i < chk.losses.size() && chk.losses[i].applicable)
      fj["work_lost"] = {{"reached", chk.losses[i].reached},
                         {"restored", chk.losses[i].restored},
                         {"lost", chk.losses[i].lost},
                         {"bound", chk.losses[i].bound},
                         {"ok", chk.losses[i].ok}};
    faults.push_back(fj);
  }
  j["faults"] = faults;
  auto launches = nlohmann::json::array();
  for (auto& l : res.launches)
    launches.push_back({{"index", l.index},
                        {"pid", l.pid},
                        {"exit_code", l.exit_code},
                        {"signal", l.signal},
                        {"start_ns", l.start_ns},
                        {"end_ns", l.end_ns},
                        {"grace_ms", l.grace_ms},
                        {"base_incarnation", l.base_incarnation},
                        {"notes", l.notes}});
  j["launches"] = launches;
  auto restores = nlohmann::json::array();
  for (auto& r : res.restores)
    restores.push_back({{"path", r.path},
                        {"step", r.step},
                        {"incarnation", r.incarnation},
                        {"checked", r.checked},
                        {"ok", r.ok},
                        {"detail", r.detail}});
  j["restores"] = restores;
  auto verdicts = nlohmann::json::array();
  for (auto& v : chk.verdicts)
    verdicts.push_back({{"name", v.name}, {"status", to_string(v.status)}, {"detail", v.detail}});
  j["verdicts"] = verdicts;
  j["passed"] = chk.passed();
  j["out"] = res.out;
  j["notes"] = res.notes;
  j["leftover_temporaries"] = res.leftover_temporaries;
  j["duration_s"] = double(res.end_ns - res.start_ns) / 1e9;
  j["measured_step_ms"] = res.step_ns / 1e6;
  return j;
}

std::string render_table(const run_result& res, const check_output& chk) {
  std::ostringstream o;
  char buf[512];
  o << "faults:\n";
  std::snprintf(buf, sizeof buf, "  %-3s %-18s %-9s %-6s %-5s %-8s %s\n", "#", "fault", "status", "~step", "inc",
                "lost", "detail");
  o << buf;
  for (size_t i = 0; i < res.faults.size(); ++i) {
    auto& f = res.faults[i];
    std::string name = to_string(f.f.kind);
    if (f.f.kind == fault_kind::sigstop_worker)
      name += f.f.duration_ms ? "(" + std::to_string(f.f.duration_ms) + "ms)" : "(ever)";
    if (f.effective_grace_ms) name += "+grace";
    std::string lost = "-";
    if (i < chk.losses.size() && chk.losses[i].applicable)
      lost = std::to_string(chk.losses[i].lost) + "/" + std::to_string(chk.losses[i].bound);
    std::string ranks;
    for (int r : f.ranks) ranks += (ranks.empty() ? "rank " : ",") + std::to_string(r);
    std::string detail = ranks + (ranks.empty() || f.detail.empty() ? "" : "; ") + f.detail;
    std::snprintf(buf, sizeof buf, "  %-3zu %-18s %-9s %-6s %-5s %-8s %s\n", f.index, name.c_str(), f.status.c_str(),
                  f.est_step >= 0 ? std::to_string(f.est_step).c_str() : "-",
                  f.incarnation >= 0 ? std::to_string(f.incarnation).c_str() : "-", lost.c_str(), detail.c_str());
    o << buf;
  }
  o << "invariants:\n";
  for (auto& v : chk.verdicts) {
    std::snprintf(buf, sizeof buf, "  %-4s %-19s ", to_string(v.status), v.name.c_str());
    o << buf << v.detail << "\n";
  }
  o << (chk.passed() ? "RESULT: PASS" : "RESULT: FAIL") << "\n";
  return o.str();
}

std::string draw_timeline(const fs::path& dir, const run_config& cfg, const run_result& res) {
  const double t0 = double(res.start_ns);
  auto ts = [&](int64_t t) { return (double(t) - t0) / 1e9; };
  // Per rank: one block per rank (index), incarnations separated by a blank line.
  std::map<int64_t, std::map<int64_t, std::vector<std::pair<double, int64_t>>>> pts;
  std::ofstream saves(dir / "timeline-saves.dat"), restores(dir / "timeline-restores.dat");
  for (auto& e : res.events) {
    if (e.rank < 0) continue;
    int64_t s = e.step();
    if (s < 0) continue;
    if (e.name == "first_step" || e.name == "committed_local" || e.name == "reached_agreed_step" ||
        e.name == "restored" || e.name == "exit" || e.name == "finished") {
      int64_t step = e.name == "first_step" ? s - 1 : s;  // first_step: the step just started
      pts[e.rank][e.incarnation].push_back({ts(e.t_ns), step});
    }
    if (e.name == "committed_local") saves << ts(e.t_ns) << " " << s << "\n";
    if (e.name == "restored" && e.rank == 0) restores << ts(e.t_ns) << " " << s << "\n";
  }
  saves << "0 NaN\n";
  restores << "0 NaN\n";
  saves.close();
  restores.close();
  {
    std::ofstream d(dir / "timeline.dat");
    for (int r = 0; r < cfg.total_workers(); ++r) {
      d << "# rank " << r << "\n";
      for (auto& [inc, v] : pts[r]) {
        std::sort(v.begin(), v.end());
        for (auto& [t, s] : v) d << t << " " << s << "\n";
        d << "\n";
      }
      if (pts[r].empty()) d << "0 0\n\n";
      d << "\n";
    }
  }
  std::ofstream gp(dir / "timeline.gp");
  gp << "set terminal pngcairo size 1400,640 font ',10'\n"
     << "set output '" << (dir / "timeline.png").string() << "'\n"
     << "set title 'grace-chaos: step of each worker over time  (" << cfg.total_workers() << " workers, " << cfg.steps
     << " steps)'\n"
     << "set xlabel 'seconds since the job started'\nset ylabel 'completed step'\n"
     << "set key outside right top noenhanced\nset termoption noenhanced\nset grid\nset yrange [0:" << cfg.steps + 5
     << "]\n";
  int n = 0;
  for (auto& e : res.events)
    if (e.name == "group_started" || (e.name == "chaos_launch"))
      gp << "set arrow " << ++n << " from " << ts(e.t_ns) << ", graph 0 to " << ts(e.t_ns)
         << ", graph 1 nohead lc rgb '#888888' dt 2\n";
  for (auto& f : res.faults) {
    if (f.status != "injected") continue;
    std::string label = "f" + std::to_string(f.index) + " " + to_string(f.f.kind);
    double x = f.f.kind == fault_kind::step_error ? ts(f.t_ns) : ts(f.t_ns);
    gp << "set arrow " << ++n << " from " << x << ", graph 0 to " << x << ", graph 1 nohead lc rgb 'red' lw 2\n";
    gp << "set label " << n << " '" << label << "' at " << x << ", graph " << (0.97 - 0.05 * (f.index % 6))
       << " right rotate by 0 tc rgb 'red' front offset -0.3,0\n";
  }
  gp << "plot for [r=0:" << cfg.total_workers() - 1 << "] '" << (dir / "timeline.dat").string()
     << "' index r using 1:2 with linespoints pt 7 ps 0.4 title sprintf('rank %d', r), \\\n"
     << "  '" << (dir / "timeline-saves.dat").string()
     << "' using 1:2 with points pt 5 ps 1.1 lc rgb 'black' title 'checkpoint committed', \\\n"
     << "  '" << (dir / "timeline-restores.dat").string()
     << "' using 1:2 with points pt 9 ps 1.8 lc rgb 'dark-green' title 'restored', \\\n"
     << "  NaN with lines lc rgb 'red' lw 2 title 'fault', NaN with lines lc rgb '#888888' dt 2 title '(re)start'\n";
  gp.close();
  if (run_command({"sh", "-c", "command -v gnuplot"}) != 0)
    return "timeline: gnuplot not found, picture skipped (apt-get install gnuplot-nox); data in timeline.dat";
  std::string out;
  int code = run_command({"gnuplot", (dir / "timeline.gp").string()}, &out);
  if (code != 0) return "timeline: gnuplot failed (" + out.substr(0, 200) + ")";
  return "timeline: " + (dir / "timeline.png").string();
}

}  // namespace grace::chaos
