/// grace-ckpt: inspect and verify Grace checkpoint directories.
///
///   grace-ckpt list DIR [--json]            every checkpoint with a quick validity check
///   grace-ckpt verify DIR [--step N] [--key-file F | --token-file F]
///                                           re-check every checksum, and the signature with a key
///                                           (exit 0 ok, 1 invalid, 2 usage)
///   grace-ckpt sign DIR --key-file F | --token-file F [--step N] [--force]
///                                           sign verified steps written unsigned
///   grace-ckpt show DIR [--step N] [--json] manifest and tensor table
///
/// DIR is the checkpoint directory (holding step-* dirs); `verify` and `show`
/// also accept a single step directory.

#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <variant>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/checkpoint/manifest.hpp"
#include "runtime/checkpoint/safetensors.hpp"
#include "runtime/checkpoint/signing.hpp"
#include "runtime/net/job_token.hpp"

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace grace;

namespace {

constexpr int exit_ok = 0;
constexpr int exit_invalid = 1;
constexpr int exit_usage = 2;

int fail(int code, const std::string& msg) {
  std::cerr << "grace-ckpt: " << msg << "\n";
  return code;
}

std::string human(uint64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%" PRIu64 " B", b);
  else
    std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  return buf;
}

/// True when `p` is one checkpoint rather than a directory of them.
bool is_step_dir(const fs::path& p) {
  std::error_code ec;
  auto name = p.lexically_normal().filename();
  if (name.empty()) name = p.lexically_normal().parent_path().filename();
  return fs::exists(p / "grace-manifest.json", ec) || name.string().rfind("step-", 0) == 0;
}

/// Checks DIR exists and is a directory; an error message otherwise.
std::optional<std::string> check_dir(const fs::path& dir) {
  std::error_code ec;
  auto st = fs::status(dir, ec);
  if (!fs::exists(st)) return dir.string() + ": no such directory";
  if (!fs::is_directory(st)) return dir.string() + ": not a directory";
  return std::nullopt;
}

json info_json(const checkpoint_info& c) {
  return {{"step", c.step},   {"path", c.path.string()}, {"kind", c.kind},           {"total_bytes", c.total_bytes},
          {"valid", c.valid}, {"reason", c.reason},      {"temporary", c.temporary}, {"set_aside", c.set_aside}};
}

int cmd_list(const fs::path& dir, bool as_json) {
  if (auto e = check_dir(dir)) return fail(exit_usage, *e);
  checkpoint_store store(dir);
  auto all = store.try_list();
  if (!all) return fail(exit_usage, all.err().message);
  if (as_json) {
    json out = json::array();
    for (auto& c : *all) out.push_back(info_json(c));
    std::cout << out.dump(2) << "\n";
    return exit_ok;
  }
  if (all->empty()) {
    std::cout << "no checkpoints in " << dir.string() << "\n";
    return exit_ok;
  }
  std::printf("%-12s %-9s %12s  %s\n", "STEP", "KIND", "SIZE", "STATUS");
  for (auto& c : *all) {
    std::string st;
    if (c.temporary)
      st = "temporary: " + c.reason;
    else if (c.set_aside)
      st = "set aside: " + c.path.filename().string();
    else if (c.valid)
      st = "valid";
    else
      st = "INVALID: " + c.reason;
    std::printf("%-12" PRIu64 " %-9s %12s  %s\n", c.step, c.kind.empty() ? "-" : c.kind.c_str(),
                human(c.total_bytes).c_str(), st.c_str());
  }
  return exit_ok;
}

/// Node-local checkpoints: whether this directory holds part `f`.
bool held_here(const fs::path& step_dir, const checkpoint_file& f) {
  std::error_code ec;
  return fs::exists(fs::symlink_status(step_dir / f.name, ec));
}

/// A verified node-local step: which parts were not checked, being held
/// on other nodes' directories.
std::string elsewhere_note(const checkpoint_store& store, const fs::path& step_dir) {
  auto m = store.read_manifest(step_dir);
  if (!m) return "";
  std::map<int32_t, int> absent;
  for (auto& f : m->files)
    if (f.node >= 0 && !held_here(step_dir, f)) ++absent[f.node];
  std::string out;
  for (auto& [node, n] : absent)
    out += (out.empty() ? "" : ", ") + std::to_string(n) + " on node " + std::to_string(node);
  return out.empty() ? "" : " (node-local: parts held elsewhere not checked here: " + out + ")";
}

/// --key-file (a long-lived checkpoint key) or --token-file (the job's
/// secret, from which the job's key is derived); neither: none.
struct key_args {
  std::string key_file, token_file;
};

result<std::optional<checkpoint_key>> key_from(const key_args& a) {
  using key = std::optional<checkpoint_key>;
  if (!a.key_file.empty() && !a.token_file.empty()) return invalid_input("give --key-file or --token-file, not both");
  if (!a.key_file.empty()) {
    auto k = read_checkpoint_key_file(a.key_file);
    if (!k) return k.err();
    return key(std::move(*k));
  }
  if (a.token_file.empty()) return key();
  auto t = read_token_file(a.token_file);
  if (!t) return t.err();
  return key(checkpoint_key_from_job_secret(*t));
}

/// What a verified step's signature says: checked with the key given, or
/// only named without one.
std::string signature_note(const fs::path& step_dir, const checkpoint_store& store) {
  if (auto* k = store.signing_key()) return " (signed with key " + k->id + ")";
  auto j = read_json(step_dir / manifest_file_name);
  const std::string id = j ? manifest_key_id(*j) : "";
  return id.empty() ? " (unsigned)" : " (signed with key " + id + ", not checked: give --key-file or --token-file)";
}

int cmd_verify(const fs::path& dir, std::optional<uint64_t> step, const key_args& keys) {
  if (auto e = check_dir(dir)) return fail(exit_usage, *e);
  checkpoint_store store(dir);
  auto key = key_from(keys);
  if (!key) return fail(exit_usage, key.err().message);
  store.set_signing_key(*key);
  if (!step && is_step_dir(dir)) {
    // A single step directory.
    auto v = store.verify(dir);
    if (v)
      std::cout << dir.string() << ": OK" << signature_note(dir, store) << elsewhere_note(store, dir) << "\n";
    else
      std::cout << dir.string() << ": INVALID: " << v.err().message << "\n";
    return v ? exit_ok : exit_invalid;
  }
  if (step) {
    auto p = store.step_path(*step);
    if (!fs::exists(p)) return fail(exit_invalid, p.string() + ": no checkpoint for step " + std::to_string(*step));
    auto v = store.verify(p);
    if (v)
      std::cout << "step " << *step << ": OK" << signature_note(p, store) << elsewhere_note(store, p) << "\n";
    else
      std::cout << "step " << *step << ": INVALID: " << v.err().message << "\n";
    return v ? exit_ok : exit_invalid;
  }
  auto all = store.try_list();
  if (!all) return fail(exit_usage, all.err().message);
  int checked = 0, bad = 0;
  for (auto& c : *all) {
    if (c.temporary) {
      std::cout << "step " << c.step << ": note: " << c.path.filename().string() << " is a " << c.reason << "\n";
      continue;
    }
    if (c.set_aside) {
      std::cout << "step " << c.step << ": note: " << c.path.filename().string()
                << " was set aside as corrupt (not checked)\n";
      continue;
    }
    ++checked;
    auto v = store.verify(c.path);
    if (v) {
      std::cout << "step " << c.step << ": OK" << signature_note(c.path, store) << elsewhere_note(store, c.path)
                << "\n";
    } else {
      ++bad;
      std::cout << "step " << c.step << ": INVALID: " << v.err().message << "\n";
    }
  }
  if (checked == 0) return fail(exit_invalid, "no checkpoints in " + dir.string());
  std::cout << checked << " checked, " << bad << " invalid\n";
  return bad ? exit_invalid : exit_ok;
}

/// The step directory a command works on: `--step`, DIR itself when it is
/// a step directory, else the newest. An error is (exit code, message).
std::variant<fs::path, std::pair<int, std::string>> pick_step(const fs::path& dir, std::optional<uint64_t> step) {
  if (auto e = check_dir(dir)) return std::make_pair(exit_usage, *e);
  checkpoint_store store(dir);
  if (step) {
    auto target = store.step_path(*step);
    if (!fs::exists(target))
      return std::make_pair(exit_invalid, target.string() + ": no checkpoint for step " + std::to_string(*step));
    return target;
  }
  if (is_step_dir(dir)) return dir;
  auto all = store.try_list();
  if (!all) return std::make_pair(exit_usage, all.err().message);
  for (auto it = all->rbegin(); it != all->rend(); ++it)
    if (!it->temporary && !it->set_aside) return it->path;
  return std::make_pair(exit_invalid, "no checkpoints in " + dir.string());
}

/// Every tensor of a step as a whole (global) tensor: name, dtype, shape.
std::vector<stored_tensor> global_tensors(const fs::path& target, const std::vector<stored_tensor>& stored) {
  std::vector<stored_tensor> out;
  auto j = read_json(target / index_file_name);
  std::set<std::string> sharded;
  if (j && j->contains("grace_sharded") && (*j)["grace_sharded"].is_object())
    for (auto& [name, t] : (*j)["grace_sharded"].items()) {
      stored_tensor g;
      g.name = name;
      if (!t.contains("dtype") || !t["dtype"].is_string() || !parse_dtype(t["dtype"].get<std::string>(), g.type))
        continue;
      for (auto& d : t.value("shape", json::array())) g.shape.push_back(d.get<int64_t>());
      out.push_back(std::move(g));
      sharded.insert(name);
    }
  for (auto& t : stored)
    if (!sharded.count(t.name)) out.push_back(t);
  return out;
}

/// Writes every tensor of a checkpoint, sharded ones assembled from their
/// parts, as one safetensors file (verified first, like a restore).
int cmd_export(const fs::path& dir, std::optional<uint64_t> step, const fs::path& out_file) {
  auto picked = pick_step(dir, step);
  if (auto* e = std::get_if<std::pair<int, std::string>>(&picked)) return fail(e->first, e->second);
  const auto target = std::get<fs::path>(picked);
  if (fs::exists(out_file)) return fail(exit_usage, out_file.string() + ": exists; export never overwrites a file");
  checkpoint_store store(target.parent_path());
  // Verified first: the tensors' sizes come from it, and a damaged index
  // must not make the tool allocate what it says.
  if (auto v = store.verify(target); !v) return fail(exit_invalid, v.err().message);
  auto m = store.read_manifest(target);
  if (!m) return fail(exit_invalid, m.err().message);
  auto stored = store.read_tensors(target);
  if (!stored) return fail(exit_invalid, stored.err().message);
  auto globals = global_tensors(target, *stored);
  std::vector<std::vector<unsigned char>> bufs;
  std::vector<tensor_ref> refs;
  std::vector<safetensors::tensor_desc> descs;
  for (auto& g : globals) {
    tensor_ref r{g.name, g.type, g.shape, nullptr};
    bufs.emplace_back(r.bytes());
    r.data = bufs.back().data();
    refs.push_back(r);
    descs.push_back({g.name, g.type, g.shape, r.bytes()});
  }
  auto restored = store.restore(m->step, refs);
  if (!restored) return fail(exit_invalid, restored.err().message);
  std::vector<const void*> data;
  for (auto& b : bufs) data.push_back(b.data());
  if (auto st = safetensors::write_file(out_file, descs, data, {{"format", "pt"}}); !st)
    return fail(exit_usage, st.err().message);
  std::cout << "step " << m->step << ": " << globals.size() << " tensors written to " << out_file.string() << "\n";
  return exit_ok;
}

/// Reads every rank's own state file into m.ranks (shown inline); the
/// problems, one per unreadable or damaged file.
std::vector<std::string> resolve_rank_states(const checkpoint_store& store, const fs::path& step_dir,
                                             checkpoint_manifest& m) {
  std::vector<std::string> problems;
  for (auto& [r, file] : m.rank_files) {
    auto st = store.read_rank_state(step_dir, m, r);
    if (st)
      m.ranks[r] = std::move(*st);
    else
      problems.push_back(st.err().message);
  }
  return problems;
}

/// What `show` reads of one checkpoint: its manifest, its tensors (or why
/// they are unreadable) and the problems with its per-rank state files.
struct shown {
  fs::path path;
  checkpoint_manifest meta;
  result<std::vector<stored_tensor>> tensors;
  std::vector<std::string> rank_problems;
};

int show_json(const shown& s) {
  const auto& m = s.meta;
  json files = json::array();
  for (auto& f : m.files) {
    files.push_back({{"name", f.name}, {"size", f.size}, {"xxh3", f.xxh3}});
    if (f.node >= 0) files.back()["node"] = f.node, files.back()["here"] = held_here(s.path, f);
  }
  json out = {{"path", s.path.string()}, {"format_version", m.format_version}, {"step", m.step},
              {"world_size", m.world_size}, {"run_id", m.run_id},           {"incarnation", m.incarnation},
              {"kind", to_string(m.kind)},  {"wall_time", m.wall_time},     {"counters", m.counters},
              {"metadata", m.metadata},     {"files", files},               {"total_bytes", m.total_bytes()}};
  if (!m.ranks.empty()) {
    json ranks = json::object();
    for (auto& [r, st] : m.ranks) {
      ranks[std::to_string(r)] = rank_state_to_json(st);
      if (auto f = m.rank_files.find(r); f != m.rank_files.end()) ranks[std::to_string(r)]["file"] = f->second;
    }
    out["ranks"] = std::move(ranks);
  }
  if (s.tensors) {
    json ts = json::array();
    for (auto& t : *s.tensors)
      ts.push_back({{"name", t.name}, {"dtype", dtype_name(t.type)}, {"shape", t.shape}, {"bytes", t.bytes},
                    {"file", t.file}});
    out["tensors"] = ts;
  } else {
    out["tensors_error"] = s.tensors.err().message;
  }
  if (!s.rank_problems.empty()) out["rank_state_errors"] = s.rank_problems;
  std::cout << out.dump(2) << "\n";
  return s.tensors && s.rank_problems.empty() ? exit_ok : exit_invalid;
}

void print_header(const shown& s) {
  const auto& m = s.meta;
  std::time_t t = static_cast<std::time_t>(m.wall_time);
  char when[64];
  std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&t));
  std::cout << "path:        " << s.path.string() << "\n"
            << "step:        " << m.step << "\n"
            << "kind:        " << to_string(m.kind) << "\n"
            << "run_id:      " << m.run_id << "\n"
            << "incarnation: " << m.incarnation << "\n"
            << "world_size:  " << m.world_size << "\n"
            << "written:     " << when << "\n"
            << "format:      " << m.format_version << "\n"
            << "size:        " << human(m.total_bytes()) << " in " << m.files.size() << " files\n";
  if (!m.counters.empty()) {
    std::cout << "counters:\n";
    for (auto& [k, v] : m.counters) std::cout << "  " << k << " = " << v << "\n";
  }
  if (!m.metadata.empty()) {
    std::cout << "metadata:\n";
    for (auto& [k, v] : m.metadata) std::cout << "  " << k << " = " << v << "\n";
  }
  for (auto& [r, st] : m.ranks) {
    auto f = m.rank_files.find(r);
    std::cout << "rank " << r << "'s own (where it differs"
              << (f == m.rank_files.end() ? "" : ", from " + f->second) << "):\n";
    for (auto& [k, v] : st.counters) std::cout << "  " << k << " = " << v << "\n";
    for (auto& [k, v] : st.metadata) std::cout << "  " << k << " = " << v << "\n";
  }
}

int show_text(const shown& s) {
  print_header(s);
  std::cout << "files:\n";
  for (auto& f : s.meta.files) {
    std::printf("  %-40s %12s  xxh3 %s", f.name.c_str(), human(f.size).c_str(), f.xxh3.c_str());
    if (f.node >= 0) std::printf("  node %d%s", f.node, held_here(s.path, f) ? "" : " (not in this directory)");
    std::printf("\n");
  }
  if (!s.tensors) return fail(exit_invalid, s.tensors.err().message);
  size_t w = 4;
  for (auto& x : *s.tensors) w = std::max(w, x.name.size());
  std::cout << "tensors (" << s.tensors->size() << "):\n";
  std::printf("  %-*s %-5s %-20s %12s  %s\n", int(w), "NAME", "DTYPE", "SHAPE", "BYTES", "FILE");
  for (auto& x : *s.tensors)
    std::printf("  %-*s %-5s %-20s %12" PRIu64 "  %s\n", int(w), x.name.c_str(), dtype_name(x.type),
                shape_str(x.shape, ", ").c_str(), x.bytes, x.file.c_str());
  return s.rank_problems.empty() ? exit_ok : exit_invalid;
}

int cmd_show(const fs::path& dir, std::optional<uint64_t> step, bool as_json) {
  auto picked = pick_step(dir, step);
  if (auto* e = std::get_if<std::pair<int, std::string>>(&picked)) return fail(e->first, e->second);
  const auto target = std::get<fs::path>(picked);
  checkpoint_store store(dir);
  auto m = store.read_manifest(target);
  if (!m) return fail(exit_invalid, m.err().message);
  shown s{target, *m, store.read_tensors(target), {}};
  s.rank_problems = resolve_rank_states(store, target, s.meta);
  for (auto& p : s.rank_problems) std::cerr << "grace-ckpt: " << p << "\n";
  return as_json ? show_json(s) : show_text(s);
}

/// Signs one verified step; `force` re-signs a step signed with another key.
bool sign_one(const checkpoint_store& plain, const fs::path& p, uint64_t step, const checkpoint_key& key, bool force) {
  auto say = [step](const std::string& what) { std::cout << "step " << step << ": " << what << "\n"; };
  if (auto v = plain.verify(p); !v) {
    say("NOT SIGNED: " + v.err().message);
    return false;
  }
  auto j = read_json(p / manifest_file_name);
  const std::string id = j ? manifest_key_id(*j) : "";
  if (id == key.id && manifest_signature_problem(*j, key).empty()) {
    say("already signed with key " + key.id);
    return true;
  }
  if (!id.empty() && !force) {
    say(id == key.id ? "NOT SIGNED: signed with this key but changed since; --force re-signs it"
                     : "NOT SIGNED: signed with another key (" + id + "); --force re-signs it with " + key.id);
    return false;
  }
  if (auto st = sign_step_manifest(p, key); !st) {
    say("NOT SIGNED: " + st.err().message);
    return false;
  }
  say("signed with key " + key.id + (id.empty() ? "" : " (was " + id + ")"));
  return true;
}

int cmd_sign(const fs::path& dir, std::optional<uint64_t> step, const key_args& keys, bool force) {
  if (auto e = check_dir(dir)) return fail(exit_usage, *e);
  auto key = key_from(keys);
  if (!key) return fail(exit_usage, key.err().message);
  if (!*key) return fail(exit_usage, "sign needs --key-file or --token-file");
  checkpoint_store plain(dir);  // checks checksums only: the steps are not signed yet
  if (step) {
    auto p = plain.step_path(*step);
    if (!fs::exists(p)) return fail(exit_invalid, p.string() + ": no checkpoint for step " + std::to_string(*step));
    return sign_one(plain, p, *step, **key, force) ? exit_ok : exit_invalid;
  }
  auto all = plain.try_list();
  if (!all) return fail(exit_usage, all.err().message);
  int done = 0, refused = 0;
  for (auto& c : *all) {
    if (c.temporary || c.set_aside) continue;
    (sign_one(plain, c.path, c.step, **key, force) ? done : refused)++;
  }
  if (done + refused == 0) return fail(exit_invalid, "no checkpoints in " + dir.string());
  std::cout << done << " signed, " << refused << " not signed\n";
  return refused ? exit_invalid : exit_ok;
}

}  // namespace

int main(int argc, char** argv) {
  spdlog::set_level(spdlog::level::err);  // the tool prints its own findings
  CLI::App app{"Inspect and verify Grace checkpoint directories"};
  app.require_subcommand(1);

  std::string dir;
  bool as_json = false;
  uint64_t step = 0;

  auto* list = app.add_subcommand("list", "List checkpoints with a quick validity check");
  list->add_option("DIR", dir, "checkpoint directory")->required();
  list->add_flag("--json", as_json, "machine-readable output");

  auto* verify = app.add_subcommand("verify", "Re-check every checksum (exit 0: all valid, 1: any invalid)");
  verify->add_option("DIR", dir, "checkpoint directory or one step directory")->required();
  auto* verify_step = verify->add_option("--step", step, "only this step");
  key_args keys;
  verify->add_option("--key-file", keys.key_file, "check signatures with this checkpoint key (mode 600)");
  verify->add_option("--token-file", keys.token_file, "check signatures with the key of this job secret (mode 600)");

  bool force = false;
  auto* sign = app.add_subcommand("sign", "Sign steps whose checksums verify with a checkpoint key (adopt "
                                           "checkpoints written unsigned); exit 0: all signed");
  sign->add_option("DIR", dir, "checkpoint directory")->required();
  auto* sign_step = sign->add_option("--step", step, "only this step");
  sign->add_option("--key-file", keys.key_file, "the checkpoint key (mode 600)");
  sign->add_option("--token-file", keys.token_file, "the job secret whose derived key signs (mode 600)");
  sign->add_flag("--force", force, "re-sign steps signed with another key");

  auto* show = app.add_subcommand("show", "Show a checkpoint's manifest and tensors (default: newest)");
  show->add_option("DIR", dir, "checkpoint directory or one step directory")->required();
  auto* show_step = show->add_option("--step", step, "this step");
  show->add_flag("--json", as_json, "machine-readable output");

  std::string out_file;
  auto* exp = app.add_subcommand("export", "Write every tensor as one safetensors file, sharded ones assembled "
                                            "from their parts (default: newest checkpoint)");
  exp->add_option("DIR", dir, "checkpoint directory or one step directory")->required();
  exp->add_option("OUT", out_file, "the safetensors file to write (must not exist)")->required();
  auto* exp_step = exp->add_option("--step", step, "this step");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return exit_usage;
  }

  if (*list) return cmd_list(dir, as_json);
  if (*verify) return cmd_verify(dir, verify_step->count() ? std::optional<uint64_t>(step) : std::nullopt, keys);
  if (*sign) return cmd_sign(dir, sign_step->count() ? std::optional<uint64_t>(step) : std::nullopt, keys, force);
  if (*exp) return cmd_export(dir, exp_step->count() ? std::optional<uint64_t>(step) : std::nullopt, out_file);
  if (*show) return cmd_show(dir, show_step->count() ? std::optional<uint64_t>(step) : std::nullopt, as_json);
  return exit_usage;
}
