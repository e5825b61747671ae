#pragma once
/// grace-chaos output: the terminal table, DIR/report.json and DIR/timeline.png.

#include "apps/chaos/invariants.hpp"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>

namespace grace::chaos {

/// The full machine-readable report of one run.
nlohmann::json make_report(const run_config& cfg, const run_result& res, const check_output& chk,
                           const nlohmann::json& extra);

/// The human table (faults, then one verdict per invariant).
std::string render_table(const run_result& res, const check_output& chk);

/// Writes DIR/timeline.dat + timeline.gp and runs gnuplot on them. Returns
/// a one-line note (written, or why it was skipped).
std::string draw_timeline(const std::filesystem::path& dir, const run_config& cfg, const run_result& res);

}  // namespace grace::chaos
