#pragma once
// A unique directory under the system temp dir, removed on scope exit
// (shared by the unit and actor tests).
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <random>
#include <string>
#include <system_error>

namespace grace::testing {

struct temp_dir {
  std::filesystem::path path;
  explicit temp_dir(const std::string& prefix = "grace-test") {
    static std::atomic<int> counter{0};
    std::random_device rd;
    path = std::filesystem::temp_directory_path() /
           (prefix + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + "-" + std::to_string(rd()));
    std::filesystem::create_directories(path);
  }
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
};

}  // namespace grace::testing
