// Tests for runtime/safetensors, runtime/checkpoint and runtime/snapshot.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mount.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>
#include <xxhash.h>

#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/base/events.hpp"
#include "runtime/checkpoint/safetensors.hpp"
#include "runtime/checkpoint/snapshot.hpp"
#include "../skip.hpp"
#include "../temp_dir.hpp"

namespace fs = std::filesystem;
using namespace grace;

namespace {

struct temp_dir : grace::testing::temp_dir {
  temp_dir() : grace::testing::temp_dir("grace-ckpt-test") {}
};

/// A few tensors of different dtypes with deterministic contents.
struct model {
  std::vector<float> w;        // F32 [4,5]
  std::vector<int64_t> steps;  // I64 [7]
  std::vector<uint16_t> h;     // BF16 [3,2,2]
  double scalar = 0;           // F64 []
  std::vector<uint8_t> empty;  // U8 [0,3]

  explicit model(int seed) {
    std::mt19937 g(static_cast<unsigned>(seed));
    for (int i = 0; i < 20; ++i) w.push_back(std::uniform_real_distribution<float>(-1, 1)(g));
    for (int i = 0; i < 7; ++i) steps.push_back(static_cast<int64_t>(g()) << 20);
    for (int i = 0; i < 12; ++i) h.push_back(static_cast<uint16_t>(g()));
    scalar = seed * 1.25;
  }
  void zero() {
    std::fill(w.begin(), w.end(), 0.f);
    std::fill(steps.begin(), steps.end(), 0);
    std::fill(h.begin(), h.end(), 0);
    scalar = 0;
  }
  std::vector<tensor_ref> refs() {
    return {
        {"layer.w", dtype::f32, {4, 5}, w.data()},     {"opt.steps", dtype::i64, {7}, steps.data()},
        {"layer.h", dtype::bf16, {3, 2, 2}, h.data()}, {"scalar", dtype::f64, {}, &scalar},
        {"empty", dtype::u8, {0, 3}, empty.data()},
    };
  }
  bool operator==(const model& o) const {
    return std::memcmp(w.data(), o.w.data(), w.size() * 4) == 0 &&
           std::memcmp(steps.data(), o.steps.data(), steps.size() * 8) == 0 &&
           std::memcmp(h.data(), o.h.data(), h.size() * 2) == 0 && std::memcmp(&scalar, &o.scalar, sizeof scalar) == 0;
  }
};

std::vector<snapshot_tensor> snap(const std::vector<tensor_ref>& refs) {
  std::vector<snapshot_tensor> out;
  for (auto& r : refs) out.push_back({r.name, r.type, r.shape, r.data, r.bytes()});
  return out;
}

checkpoint_meta meta_for(uint64_t step, checkpoint_kind kind = checkpoint_kind::periodic) {
  checkpoint_meta m;
  m.step = step;
  m.world_size = 4;
  m.run_id = "run-abc";
  m.incarnation = 2;
  m.kind = kind;
  m.counters = {{"samples", int64_t(step) * 32}, {"negative", -5}};
  m.metadata = {{"model", "mlp"}, {"note", "unit test"}};
  return m;
}

void save_ok(checkpoint_store& store, model& m, uint64_t step) {
  auto r = store.save(snap(m.refs()), meta_for(step));
  INFO((r ? std::string() : r.err().what()));
  REQUIRE(r.ok());
}

fs::path first_shard(const fs::path& step_dir) { return step_dir / "model-00001-of-00001.safetensors"; }

std::string read_all(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}
void write_all(const fs::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f << s;
}

bool has(const std::string& haystack, const std::string& needle) { return haystack.find(needle) != std::string::npos; }

}  // namespace

TEST_CASE("safetensors header encodes, pads and parses", "[checkpoint][safetensors]") {
  temp_dir td;
  model m(1);
  std::vector<safetensors::tensor_desc> descs;
  std::vector<const void*> data;
  for (auto& r : m.refs()) {
    descs.push_back({r.name, r.type, r.shape, r.bytes()});
    data.push_back(r.data);
  }
  auto enc = safetensors::encode_header(descs, {{"format", "pt"}});
  REQUIRE(enc.ok());
  CHECK(enc->bytes.size() % 8 == 0);
  auto file = td.path / "a.safetensors";
  REQUIRE(safetensors::write_file(file, descs, data, {{"format", "pt"}}).ok());
  auto h = safetensors::read_header(file);
  REQUIRE(h.ok());
  CHECK(h->data_start % 8 == 0);
  CHECK(h->metadata.at("format") == "pt");
  CHECK(h->tensors.size() == 5);
  for (auto& e : h->tensors)
    if (e.name == "layer.w") {
      std::vector<float> back(20);
      REQUIRE(safetensors::read_tensor(file, *h, e, back.data()).ok());
      CHECK(back == m.w);
    }

  SECTION("byte count not matching the shape is refused on write") {
    descs[0].bytes += 4;
    CHECK(safetensors::encode_header(descs, {}).err().code == errc::invalid_input);
  }
  SECTION("duplicate names are refused on write") {
    descs[1].name = descs[0].name;
    CHECK_FALSE(safetensors::encode_header(descs, {}).ok());
  }
}

TEST_CASE("safetensors parsing is defensive", "[checkpoint][safetensors]") {
  auto parse = [](const std::string& js, uint64_t data_bytes) {
    return safetensors::parse_header("f.safetensors", js.data(), js.size(), 8 + js.size() + data_bytes);
  };
  CHECK(parse(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8).ok());
  auto expect_bad = [&](const std::string& js, uint64_t data_bytes, const std::string& what) {
    auto r = parse(js, data_bytes);
    REQUIRE_FALSE(r.ok());
    CHECK(r.err().code == errc::invalid_input);
    INFO(r.err().message);
    CHECK(has(r.err().message, "f.safetensors: "));
    CHECK(has(r.err().message, what));
  };
  expect_bad(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})", 8, "not valid JSON");
  expect_bad(R"([1,2])", 0, "not a JSON object");
  expect_bad(R"({"a":{"dtype":"X9","shape":[2],"data_offsets":[0,8]}})", 8, "unknown dtype");
  expect_bad(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8, "do not match");
  expect_bad(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4, "exceed the data section");
  expect_bad(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8, "begin > end");
  expect_bad(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8, "non-negative");
  expect_bad(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,8]}})", 8, "do not match");
  expect_bad(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
             R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
             12, "overlap");
  expect_bad(R"({"__metadata__":{"k":1}})", 0, "not a string");

  // File-level problems.
  temp_dir td;
  auto f = td.path / "x.safetensors";
  write_all(f, "abc");
  CHECK(has(safetensors::read_header(f).err().message, "truncated"));
  write_all(f, std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8) + "{}");
  auto r = safetensors::read_header(f);
  CHECK(r.err().code == errc::invalid_input);
  CHECK(has(r.err().message, "exceeds file size"));
  CHECK(has(safetensors::read_header(td.path / "nope").err().message, "missing"));
}

TEST_CASE("checkpoint round trip is bit-identical", "[checkpoint]") {
  temp_dir td;
  checkpoint_store store(td.path / "ckpts");
  model m(7);
  auto r = store.save(snap(m.refs()), meta_for(120, checkpoint_kind::initial));
  REQUIRE(r.ok());
  CHECK(r->step == 120);
  CHECK(r->path == td.path / "ckpts" / "step-0000000120");
  CHECK(r->files.size() == 2);  // one shard + index (manifest not self-listed)
  CHECK(r->total_bytes > 0);
  CHECK(r->write_seconds > 0);  // measured, not left at zero
  CHECK(r->fsync_seconds > 0);
  CHECK(fs::exists(r->path / "model-00001-of-00001.safetensors"));
  CHECK(fs::exists(r->path / "model.safetensors.index.json"));
  CHECK(fs::exists(r->path / "grace-manifest.json"));
  CHECK(store.verify(120).ok());
  CHECK(store.stale_temporaries().empty());

  model back(0);
  back.zero();
  auto res = store.restore_latest(back.refs());
  REQUIRE(res.ok());
  REQUIRE(res->found);
  CHECK(back == m);
  CHECK(res->skipped.empty());
  CHECK(res->unregistered.empty());
  CHECK(res->loaded.size() == 5);
  auto& man = res->manifest;
  CHECK(man.step == 120);
  CHECK(man.world_size == 4);
  CHECK(man.run_id == "run-abc");
  CHECK(man.incarnation == 2);
  CHECK(man.kind == checkpoint_kind::initial);
  CHECK(man.wall_time > 1.6e9);
  CHECK(man.counters == meta_for(120).counters);
  CHECK(man.metadata == meta_for(120).metadata);

  auto list = store.list();
  REQUIRE(list.size() == 1);
  CHECK(list[0].valid);
  CHECK(list[0].kind == "initial");
  CHECK(list[0].step == 120);

  auto tensors = store.read_tensors(r->path);
  REQUIRE(tensors.ok());
  CHECK(tensors->size() == 5);

  SECTION("restoring a subset lists the rest as unregistered") {
    auto refs = back.refs();
    refs.resize(2);
    auto sub = store.restore(120, refs);
    REQUIRE(sub.ok());
    CHECK(sub->unregistered == std::vector<std::string>{"empty", "layer.h", "scalar"});
  }
  SECTION("saving the same step again keeps the existing valid one") {
    model other(8);
    auto again = store.save(snap(other.refs()), meta_for(120));
    REQUIRE(again.ok());
    CHECK(again->already_existed);
    back.zero();
    REQUIRE(store.restore(120, back.refs()).ok());
    CHECK(back == m);
  }
  SECTION("saving over an invalid step moves the old one aside") {
    fs::remove(r->path / "grace-manifest.json");
    model other(8);
    REQUIRE(store.save(snap(other.refs()), meta_for(120)).ok());
    back.zero();
    REQUIRE(store.restore(120, back.refs()).ok());
    CHECK(back == other);
    int aside = 0;
    for (auto& e : fs::directory_iterator(td.path / "ckpts"))
      if (has(e.path().filename().string(), "step-0000000120.corrupt-")) ++aside;
    CHECK(aside == 1);
    auto l = store.list();
    REQUIRE(l.size() == 2);
    CHECK(l[0].set_aside != l[1].set_aside);
  }
}

TEST_CASE("tensors are split across shards of at most shard_bytes", "[checkpoint]") {
  temp_dir td;
  checkpoint_store store(td.path);
  store.set_shard_bytes(100);
  std::vector<std::vector<float>> data(5, std::vector<float>(20));  // 80 bytes each
  std::vector<float> big(64);                                       // 256 bytes: own shard
  std::vector<tensor_ref> refs;
  for (size_t i = 0; i < data.size(); ++i) {
    for (size_t j = 0; j < 20; ++j) data[i][j] = float(i * 100 + j);
    refs.push_back({"t" + std::to_string(i), dtype::f32, {4, 5}, data[i].data()});
  }
  for (size_t j = 0; j < big.size(); ++j) big[j] = -float(j);
  refs.insert(refs.begin() + 2, tensor_ref{"big", dtype::f32, {64}, big.data()});
  auto r = store.save(snap(refs), meta_for(3));
  REQUIRE(r.ok());
  CHECK(r->files.size() == 7);  // 6 shards + index
  CHECK(fs::exists(r->path / "model-00001-of-00006.safetensors"));
  CHECK(fs::exists(r->path / "model-00006-of-00006.safetensors"));

  auto index = nlohmann::json::parse(read_all(r->path / "model.safetensors.index.json"));
  CHECK(index["metadata"]["total_size"] == 5 * 80 + 256);
  CHECK(index["weight_map"]["t0"] == "model-00001-of-00006.safetensors");
  CHECK(index["weight_map"]["big"] == "model-00003-of-00006.safetensors");
  for (auto& f : r->files)
    if (has(f.name, "safetensors") && !has(f.name, "index")) CHECK(f.size < 8 + 200 + 256 + 8);

  CHECK(store.verify(3).ok());
  auto copy = data;
  auto big_copy = big;
  for (auto& d : data) std::fill(d.begin(), d.end(), 0.f);
  std::fill(big.begin(), big.end(), 0.f);
  REQUIRE(store.restore_latest(refs).ok());
  CHECK(data == copy);
  CHECK(big == big_copy);
}

TEST_CASE("a commit gate's no leaves the save uncommitted and the previous step intact", "[checkpoint][fence]") {
  temp_dir td;
  checkpoint_store store(td.path, 0);
  model m(1);
  save_ok(store, m, 1);
  int asked = 0;
  auto no = store.save(snap(m.refs()), meta_for(2), {}, [&]() -> status {
    ++asked;
    CHECK(store.list().size() == 2);  // asked with every file durable, the step not renamed yet
    return error{errc::failed, "declared dead"};
  });
  REQUIRE_FALSE(no.ok());
  CHECK_THAT(no.err().message, Catch::Contains("declared dead"));
  CHECK(asked == 1);
  CHECK_FALSE(fs::exists(store.step_path(2)));
  auto l = store.list();
  REQUIRE(l.size() == 1);  // no temporary left either
  CHECK(l[0].step == 1);
  CHECK(store.verify(store.step_path(1)));

  const int64_t before = wall_ns();
  auto yes = store.save(snap(m.refs()), meta_for(3), {}, [] { return status{}; });
  REQUIRE(yes.ok());
  CHECK(fs::exists(store.step_path(3)));
  CHECK(yes->committed_wall_ns >= before);
  CHECK(yes->committed_wall_ns <= wall_ns());
}

TEST_CASE("keep_last deletes only older valid checkpoints", "[checkpoint]") {
  temp_dir td;
  checkpoint_store store(td.path, 2);
  model m(1);
  save_ok(store, m, 1);
  save_ok(store, m, 2);
  fs::remove(store.step_path(2) / "grace-manifest.json");  // step 2 now invalid
  save_ok(store, m, 3);
  save_ok(store, m, 4);
  CHECK_FALSE(fs::exists(store.step_path(1)));
  CHECK(fs::exists(store.step_path(2)));  // invalid: left in place, never deleted
  CHECK(fs::exists(store.step_path(3)));
  CHECK(fs::exists(store.step_path(4)));
  save_ok(store, m, 5);
  CHECK_FALSE(fs::exists(store.step_path(3)));
  CHECK(fs::exists(store.step_path(2)));

  // A newer checkpoint (e.g. from before a rollback) is never pruned by an
  // older commit.
  save_ok(store, m, 100);
  save_ok(store, m, 6);
  CHECK(fs::exists(store.step_path(100)));
  CHECK(fs::exists(store.step_path(6)));
  CHECK_FALSE(fs::exists(store.step_path(5)));
  auto l = store.list();
  REQUIRE(l.size() == 3);
  CHECK_FALSE(l[0].valid);
  CHECK(has(l[0].reason, "grace-manifest.json"));
}

namespace {
/// Saves step 1 (model A) and step 2 (model B), corrupts step 2 with `mutate`,
/// and checks restore falls back to step 1 while step 2 stays on disk.
void check_fallback(const std::function<void(const fs::path&)>& mutate, const std::string& reason_part,
                    bool quick_check_catches) {
  temp_dir td;
  checkpoint_store store(td.path);
  model a(1), b(2);
  save_ok(store, a, 1);
  save_ok(store, b, 2);
  mutate(store.step_path(2));

  auto v = store.verify(2);
  REQUIRE_FALSE(v.ok());
  CHECK(v.err().code == errc::invalid_input);
  INFO(v.err().message);
  CHECK(has(v.err().message, reason_part));
  CHECK(store.verify(1).ok());

  auto l = store.list();
  REQUIRE(l.size() == 2);
  CHECK(l[1].valid == !quick_check_catches);

  model back(0);
  back.zero();
  auto r = store.restore_latest(back.refs());
  REQUIRE(r.ok());
  REQUIRE(r->found);
  CHECK(r->manifest.step == 1);
  CHECK(back == a);
  REQUIRE(r->skipped.size() == 1);
  CHECK(r->skipped[0].step == 2);
  CHECK(has(r->skipped[0].reason, reason_part));
  CHECK(fs::exists(store.step_path(2)));  // never deleted

  // Restoring that step explicitly is an error, not a silent fallback.
  CHECK(store.restore(2, back.refs()).err().code == errc::invalid_input);
}
}  // namespace

TEST_CASE("corrupt checkpoints are detected and skipped", "[checkpoint]") {
  SECTION("flipped byte") {
    check_fallback(
        [](const fs::path& d) {
          auto p = first_shard(d);
          auto s = read_all(p);
          s[s.size() - 10] ^= 0x40;
          write_all(p, s);
        },
        "checksum mismatch", false);
  }
  SECTION("truncated shard") {
    check_fallback(
        [](const fs::path& d) {
          auto p = first_shard(d);
          fs::resize_file(p, fs::file_size(p) - 16);
        },
        "truncated", true);
  }
  SECTION("missing manifest") {
    check_fallback([](const fs::path& d) { fs::remove(d / "grace-manifest.json"); }, "missing", true);
  }
  SECTION("garbage manifest") {
    check_fallback([](const fs::path& d) { write_all(d / "grace-manifest.json", "{\"step\": "); }, "not valid JSON",
                   true);
  }
  SECTION("unknown dtype in header") {
    check_fallback(
        [](const fs::path& d) {
          auto p = first_shard(d);
          auto s = read_all(p);
          auto at = s.find("\"F32\"");
          REQUIRE(at != std::string::npos);
          s[at + 1] = 'Q';
          write_all(p, s);
          CHECK(has(safetensors::read_header(p).err().message, "unknown dtype 'Q32'"));
        },
        "checksum mismatch", false);
  }
  SECTION("header length bigger than the file") {
    check_fallback(
        [](const fs::path& d) {
          auto p = first_shard(d);
          auto s = read_all(p);
          uint64_t n = s.size() + 1000;
          for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(n >> (8 * i));
          write_all(p, s);
          CHECK(has(safetensors::read_header(p).err().message, "exceeds file size"));
        },
        "checksum mismatch", false);
  }
}

/// Rewrites a JSON file of a step directory and, as an attacker would, its
/// size and checksum in the manifest (xxh3 is no MAC).
void edit_json(const fs::path& p, const std::function<void(nlohmann::json&)>& f) {
  auto j = nlohmann::json::parse(read_all(p));
  f(j);
  auto text = j.dump();
  write_all(p, text);
  auto mp = p.parent_path() / "grace-manifest.json";
  if (p == mp) return;
  auto m = nlohmann::json::parse(read_all(mp));
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(XXH3_64bits(text.data(), text.size())));
  for (auto& e : m["files"])
    if (e["name"] == p.filename().string()) {
      e["size"] = text.size();
      e["xxh3"] = hex;
    }
  write_all(mp, m.dump());
}

TEST_CASE("hostile checkpoints: nothing outside the directory is read", "[checkpoint][hostile]") {
  // A copy of the shard outside the checkpoint directory: same bytes, so a
  // checksum alone would accept it (xxh3 is no MAC).
  SECTION("a manifest entry with ..") {
    check_fallback(
        [](const fs::path& d) {
          edit_json(d / "grace-manifest.json", [](nlohmann::json& j) { j["files"][0]["name"] = "../outside.safetensors"; });
        },
        "../outside.safetensors", true);
  }
  SECTION("a manifest entry with an absolute path") {
    check_fallback(
        [](const fs::path& d) {
          edit_json(d / "grace-manifest.json", [](nlohmann::json& j) { j["files"][0]["name"] = "/etc/passwd"; });
        },
        "/etc/passwd", true);
  }
  SECTION("an index entry with ..") {
    check_fallback(
        [](const fs::path& d) {
          fs::copy_file(first_shard(d), d.parent_path() / "outside.safetensors");
          edit_json(d / "model.safetensors.index.json",
                    [](nlohmann::json& j) { j["weight_map"]["layer.w"] = "../outside.safetensors"; });
        },
        "../outside.safetensors", false);
  }
  SECTION("a step directory that is a symlink to one outside") {
    temp_dir td, elsewhere;
    checkpoint_store store(td.path);
    model a(1), b(2);
    save_ok(store, a, 1);
    checkpoint_store other(elsewhere.path);
    save_ok(other, b, 2);
    fs::create_directory_symlink(other.step_path(2), store.step_path(2));
    auto l = store.list();
    REQUIRE(l.size() == 2);
    CHECK_FALSE(l[1].valid);
    CHECK(has(l[1].reason, "symbolic link"));
    model back(0);
    back.zero();
    auto r = store.restore_latest(back.refs());
    REQUIRE(r.ok());
    CHECK(r->manifest.step == 1);
    CHECK(back == a);
    REQUIRE(r->skipped.size() == 1);
    CHECK(has(r->skipped[0].reason, "symbolic link"));
  }
  SECTION("a shard that is a symlink to a file outside") {
    check_fallback(
        [](const fs::path& d) {
          auto outside = d.parent_path() / "outside.safetensors";
          fs::copy_file(first_shard(d), outside);
          fs::remove(first_shard(d));
          fs::create_symlink(outside, first_shard(d));
        },
        "symbolic link", false);
  }
  SECTION("a deeply nested manifest") {
    check_fallback(
        [](const fs::path& d) {
          write_all(d / "grace-manifest.json", std::string(100000, '[') + std::string(100000, ']'));
        },
                   "grace-manifest.json", true);
  }
}

TEST_CASE("leftover temporary directories are ignored, listed and cleaned", "[checkpoint]") {
  temp_dir td;
  checkpoint_store store(td.path);
  model a(1);
  save_ok(store, a, 1);
  // A crashed writer (pid that cannot exist) left a partial step 2.
  auto dead = td.path / ".tmp-step-2-2147483000-deadbeef";
  fs::create_directories(dead);
  write_all(dead / "model-00001-of-00001.safetensors", "partial");
  // And one with our own pid that this process is not writing.
  auto own = td.path / (".tmp-step-3-" + std::to_string(::getpid()) + "-0badf00d");
  fs::create_directories(own);

  model back(0);
  back.zero();
  auto r = store.restore_latest(back.refs());
  REQUIRE(r.ok());
  CHECK(r->manifest.step == 1);
  CHECK(back == a);
  auto l = store.list();
  REQUIRE(l.size() == 3);
  int temps = 0;
  for (auto& c : l)
    if (c.temporary) {
      ++temps;
      CHECK_FALSE(c.valid);
    }
  CHECK(temps == 2);
  CHECK(store.stale_temporaries().size() == 2);

  save_ok(store, a, 4);  // the writer cleans stale temporaries first
  CHECK_FALSE(fs::exists(dead));
  CHECK_FALSE(fs::exists(own));
  CHECK(store.stale_temporaries().empty());
}

TEST_CASE("restore checks dtype, shape and presence", "[checkpoint]") {
  temp_dir td;
  checkpoint_store store(td.path);
  model a(1);
  save_ok(store, a, 5);
  model back(0);
  back.zero();
  auto refs = back.refs();

  SECTION("shape mismatch") {
    refs[0].shape = {5, 4};
    auto r = store.restore_latest(refs);
    REQUIRE_FALSE(r.ok());
    CHECK(r.err().code == errc::invalid_input);
    INFO(r.err().message);
    CHECK(has(r.err().message, "'layer.w'"));
    CHECK(has(r.err().message, "expected F32 [5,4]"));
    CHECK(has(r.err().message, "checkpoint has F32 [4,5]"));
  }
  SECTION("dtype mismatch") {
    refs[1].type = dtype::u64;
    auto r = store.restore_latest(refs);
    REQUIRE_FALSE(r.ok());
    CHECK(r.err().code == errc::invalid_input);
    CHECK(has(r.err().message, "expected U64 [7], checkpoint has I64 [7]"));
  }
  SECTION("registered tensor missing from the checkpoint") {
    float extra[2];
    refs.push_back({"new.param", dtype::f32, {2}, extra});
    auto r = store.restore_latest(refs);
    REQUIRE_FALSE(r.ok());
    CHECK(has(r.err().message, "'new.param'"));
  }
  SECTION("device tensors need the CUDA backend") {
    refs[0].memory = memory_kind::device;
    auto r = store.restore_latest(refs);
    REQUIRE_FALSE(r.ok());
    CHECK(has(r.err().message, "CUDA"));
  }
  // Nothing was written into the caller's memory on failure.
  model zero(0);
  zero.zero();
  CHECK(back == zero);
}

TEST_CASE("no checkpoint is not an error", "[checkpoint]") {
  temp_dir td;
  model back(0);
  checkpoint_store missing(td.path / "does-not-exist");
  auto r = missing.restore_latest(back.refs());
  REQUIRE(r.ok());
  CHECK_FALSE(r->found);
  CHECK(missing.list().empty());

  checkpoint_store empty(td.path);
  auto e = empty.restore_latest(back.refs());
  REQUIRE(e.ok());
  CHECK_FALSE(e->found);

  write_all(td.path / "file", "x");
  checkpoint_store not_dir(td.path / "file");
  CHECK(not_dir.restore_latest(back.refs()).err().code == errc::invalid_input);
}

TEST_CASE("snapshot buffers capture into aligned regions", "[checkpoint][snapshot]") {
  temp_dir td;
  checkpoint_store store(td.path, 10);
  model m(3);
  auto layout = m.refs();
  auto set_a = std::make_shared<snapshot_buffers>(layout);
  for (auto& t : set_a->view()) CHECK(reinterpret_cast<uintptr_t>(t.data) % snapshot_buffers::alignment == 0);
  CHECK(set_a->total_bytes() == 80 + 56 + 24 + 8);
  REQUIRE(set_a->capture(m.refs()).ok());
  REQUIRE(store.save(set_a->view(), meta_for(1)).ok());
  model back(0);
  back.zero();
  REQUIRE(store.restore(1, back.refs()).ok());
  CHECK(back == m);

  SECTION("capture checks the layout and refuses device tensors") {
    auto refs = m.refs();
    refs[2].shape = {12};
    CHECK(set_a->capture(refs).err().code == errc::invalid_input);
    refs = m.refs();
    refs[0].memory = memory_kind::device;
    CHECK(has(set_a->capture(refs).err().message, "device tensors need the CUDA backend"));
    refs.pop_back();
    CHECK(set_a->capture(refs).err().code == errc::invalid_input);
  }
  SECTION("capture refuses while a write owns the buffers") {
    set_a->set_busy(true);
    CHECK(set_a->capture(m.refs()).err().code == errc::overloaded);
    set_a->set_busy(false);
  }
}

namespace {
/// Whole contents of a file.
std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

/// A directory on a filesystem that honours O_DIRECT (tmpfs, often /tmp,
/// may not; then /var/tmp).
fs::path direct_io_base() {
  struct statfs sf {};
  if (::statfs("/tmp", &sf) == 0 && sf.f_type != TMPFS_MAGIC) return "/tmp";
  return "/var/tmp";
}
}  // namespace

TEST_CASE("O_DIRECT and buffered saves write identical files and manifests", "[checkpoint][odirect]") {
  const fs::path base = direct_io_base();
  fs::path root = base / ("grace-odirect-test-" + std::to_string(::getpid()));
  struct cleanup {
    fs::path p;
    ~cleanup() {
      std::error_code ec;
      fs::remove_all(p, ec);
    }
  } guard{root};
  fs::create_directories(root);
  {
    // Say so when the direct path cannot be exercised here.
    int fd = ::open((root / "probe").c_str(), O_WRONLY | O_CREAT | O_DIRECT | O_CLOEXEC, 0644);
    if (fd < 0)
      WARN("O_DIRECT unsupported under " << base << ": both saves take the buffered path");
    else
      ::close(fd);
    fs::remove(root / "probe");
  }

  // One tensor crossing a 64 MiB staging buffer with an unaligned tail, so
  // both buffers, the padding and the truncation are exercised; small
  // tensors of the usual dtypes in a second shard.
  model m(7);
  std::vector<uint8_t> big((64u << 20) + 12345);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);
  auto refs = m.refs();
  refs.insert(refs.begin(), tensor_ref{"big", dtype::u8, {int64_t(big.size())}, big.data()});

  checkpoint_store direct(root / "direct");
  checkpoint_store buffered(root / "buffered");
  direct.set_shard_bytes(32u << 20);
  buffered.set_shard_bytes(32u << 20);
  buffered.set_direct_io(false);
  CHECK(direct.direct_io());
  CHECK_FALSE(buffered.direct_io());
  auto a = direct.save(snap(refs), meta_for(5));
  auto b = buffered.save(snap(refs), meta_for(5));
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  REQUIRE(a->files.size() == 3);  // two shards and the index
  REQUIRE(a->files.size() == b->files.size());
  for (size_t i = 0; i < a->files.size(); ++i) {
    INFO(a->files[i].name);
    CHECK(a->files[i].name == b->files[i].name);
    CHECK(a->files[i].size == b->files[i].size);
    CHECK(a->files[i].xxh3 == b->files[i].xxh3);
    CHECK(fs::file_size(a->path / a->files[i].name) == a->files[i].size);
    CHECK(slurp(a->path / a->files[i].name) == slurp(b->path / b->files[i].name));
  }
  // Manifests: identical but for the commit time.
  auto ja = nlohmann::json::parse(slurp(a->path / "grace-manifest.json"));
  auto jb = nlohmann::json::parse(slurp(b->path / "grace-manifest.json"));
  for (auto* j : {&ja, &jb}) {
    j->erase("wall_time");
    j->erase("wall_time_utc");
  }
  CHECK(ja == jb);
  CHECK(direct.verify(5).ok());
  CHECK(buffered.verify(5).ok());

  std::vector<uint8_t> big_back(big.size());
  model back(0);
  back.zero();
  auto back_refs = back.refs();
  back_refs.insert(back_refs.begin(), tensor_ref{"big", dtype::u8, {int64_t(big.size())}, big_back.data()});
  auto res = direct.restore_latest(back_refs);
  REQUIRE(res.ok());
  CHECK(back == m);
  CHECK(big_back == big);
}

TEST_CASE("restore reads each file once and scatters across read chunks", "[checkpoint][odirect]") {
  temp_dir td;
  // Three tensors with odd sizes in one ~100 MiB shard, so tensor edges fall
  // inside the 64 MiB read chunks and inside their 32 MiB halves; the third
  // is not registered on restore (read and hashed, not copied).
  auto fill = [](std::vector<uint8_t>& v, uint32_t seed) {
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint8_t>(((i + seed) * 2654435761u) >> 11);
  };
  std::vector<uint8_t> a((40u << 20) + 3), b((30u << 20) + 5), c(30u << 20);
  fill(a, 1);
  fill(b, 2);
  fill(c, 3);
  auto refs_of = [](std::vector<uint8_t>& x, std::vector<uint8_t>& y, std::vector<uint8_t>& z) {
    return std::vector<tensor_ref>{{"a", dtype::u8, {int64_t(x.size())}, x.data()},
                                   {"b", dtype::u8, {int64_t(y.size())}, y.data()},
                                   {"c", dtype::u8, {int64_t(z.size())}, z.data()}};
  };
  checkpoint_store store(td.path, 5);
  REQUIRE(store.save(snap(refs_of(a, b, c)), meta_for(1)).ok());
  // Step 2 differs, then gets one flipped byte near the end of the second
  // read chunk (inside tensor c).
  fill(a, 11);
  REQUIRE(store.save(snap(refs_of(a, b, c)), meta_for(2)).ok());
  const auto shard = store.step_path(2) / "model-00001-of-00001.safetensors";
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(std::streamoff(90u << 20));
    char ch = 0;
    f.read(&ch, 1);
    ch ^= 0x10;
    f.seekp(std::streamoff(90u << 20));
    f.write(&ch, 1);
  }

  std::vector<uint8_t> ra(a.size(), 0), rb(b.size(), 0), rc(c.size(), 0);
  auto back = refs_of(ra, rb, rc);
  back.pop_back();  // "c" stays unregistered
  snapshot_buffers staging(back);

  // The corrupt step, asked for explicitly: an error, and not one byte of
  // the caller's tensors changed.
  auto bad = store.restore(2, back, staging.regions());
  REQUIRE_FALSE(bad.ok());
  CHECK(has(bad.err().message, "checksum mismatch"));
  CHECK(std::all_of(ra.begin(), ra.end(), [](uint8_t v) { return v == 0; }));
  CHECK(std::all_of(rb.begin(), rb.end(), [](uint8_t v) { return v == 0; }));

  // The newest that verifies: step 1, bit for bit, through the staging.
  auto r = store.restore_latest(back, staging.regions());
  REQUIRE(r.ok());
  REQUIRE(r->found);
  CHECK(r->manifest.step == 1);
  REQUIRE(r->skipped.size() == 1);
  CHECK(r->skipped[0].step == 2);
  CHECK(r->unregistered == std::vector<std::string>{"c"});
  fill(a, 1);
  CHECK(ra == a);
  CHECK(rb == b);
  // The staging buffers now hold the restored state too.
  auto view = staging.view();
  REQUIRE(view.size() == 2);
  CHECK(std::memcmp(view[0].data, a.data(), a.size()) == 0);
  CHECK(std::memcmp(view[1].data, b.data(), b.size()) == 0);

  // Without staging (allocated internally), and a staging list of the
  // wrong length is refused before anything is read.
  std::fill(ra.begin(), ra.end(), 0);
  REQUIRE(store.restore(1, back).ok());
  CHECK(ra == a);
  auto wrong = store.restore(1, back, std::vector<void*>{nullptr});
  REQUIRE_FALSE(wrong.ok());
  CHECK(wrong.err().code == errc::invalid_input);
  CHECK(has(wrong.err().message, "staging"));
}

TEST_CASE("I/O staging prepared and kept warm while saves and restores use it", "[checkpoint][odirect]") {
  temp_dir td;
  // 72 MiB + 1: both staging buffers, the second one partly.
  std::vector<uint8_t> w((72u << 20) + 1);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);
  std::vector<tensor_ref> refs{{"w", dtype::u8, {int64_t(w.size())}, w.data()}};
  checkpoint_store store(td.path, 2);
  store.prepare_io(0);   // below the O_DIRECT size: nothing to do
  store.keep_io_warm();  // nothing prepared yet: harmless
  store.prepare_io(w.size());
  store.prepare_io(w.size());  // idempotent
  std::atomic<bool> stop{false};
  // A session's warmer and writer thread run these alongside saves and
  // restores on other threads; the bytes written and read must not change.
  std::thread toucher([&] {
    while (!stop) {
      store.keep_io_warm();
      store.prepare_io(w.size() * 2);
    }
  });
  std::vector<uint8_t> back(w.size());
  std::vector<tensor_ref> into{{"w", dtype::u8, {int64_t(back.size())}, back.data()}};
  for (uint64_t step = 1; step <= 3; ++step) {
    w[step] ^= 0x5a;
    REQUIRE(store.save(snap(refs), meta_for(step)).ok());
    std::fill(back.begin(), back.end(), 0);
    auto r = store.restore_latest(into);
    REQUIRE(r.ok());
    REQUIRE(r->found);
    CHECK(r->manifest.step == step);
    CHECK(back == w);
  }
  stop = true;
  toucher.join();
}

namespace {
/// Mounts a tmpfs on `at`; empty on success, else why not (skip reason).
std::string mount_tmpfs(const fs::path& at, const char* options) {
  if (::geteuid() != 0) return "mounting a tmpfs needs root";
  if (::mount("tmpfs", at.c_str(), "tmpfs", 0, options) != 0)
    return std::string("cannot mount a tmpfs on ") + at.string() + ": " + std::strerror(errno);
  return {};
}
}  // namespace

TEST_CASE("large checkpoints on a filesystem without O_DIRECT round trip", "[checkpoint][odirect]") {
  // tmpfs refuses O_DIRECT on older kernels and accepts it on newer ones:
  // either way save and the single-pass restore must round-trip a shard
  // above the direct-read threshold (8 MiB) bit for bit.
  temp_dir td;
  auto mnt = td.path / "tmpfs";
  fs::create_directories(mnt);
  if (auto why = mount_tmpfs(mnt, "size=96m"); !why.empty()) GRACE_SKIP(why);
  struct unmount {
    fs::path p;
    ~unmount() { ::umount2(p.c_str(), MNT_DETACH); }
  } guard{mnt};
  std::vector<uint8_t> big((20u << 20) + 7);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>((i * 40503u) >> 9);
  std::vector<tensor_ref> refs{{"big", dtype::u8, {int64_t(big.size())}, big.data()}};
  checkpoint_store store(mnt / "ckpts");
  REQUIRE(store.save(snap(refs), meta_for(3)).ok());
  CHECK(store.verify(3).ok());
  std::vector<uint8_t> back(big.size(), 0);
  std::vector<tensor_ref> into{{"big", dtype::u8, {int64_t(back.size())}, back.data()}};
  auto r = store.restore_latest(into);
  REQUIRE(r.ok());
  REQUIRE(r->found);
  CHECK(back == big);
}

TEST_CASE("a full disk fails cleanly and keeps earlier checkpoints", "[checkpoint][diskfull]") {
  temp_dir td;
  auto mnt = td.path / "small";
  fs::create_directories(mnt);
  if (auto why = mount_tmpfs(mnt, "size=1m"); !why.empty()) GRACE_SKIP(why);
  struct unmount {
    fs::path p;
    ~unmount() { ::umount2(p.c_str(), MNT_DETACH); }
  } guard{mnt};

  checkpoint_store store(mnt / "ckpts");
  model small(1);
  save_ok(store, small, 1);
  std::vector<float> big(1u << 20);  // 4 MiB
  for (size_t i = 0; i < big.size(); ++i) big[i] = float(i);
  std::vector<tensor_ref> refs{{"big", dtype::f32, {int64_t(big.size())}, big.data()}};
  auto r = store.save(snap(refs), meta_for(2));
  REQUIRE_FALSE(r.ok());
  CHECK(r.err().code == errc::failed);
  INFO(r.err().message);
  CHECK(has(r.err().message, "No space left on device"));
  CHECK_FALSE(fs::exists(store.step_path(2)));
  for (auto& e : fs::directory_iterator(mnt / "ckpts")) CHECK_FALSE(has(e.path().filename().string(), ".tmp-"));
  CHECK(store.verify(1).ok());
  model back(0);
  back.zero();
  auto res = store.restore_latest(back.refs());
  REQUIRE(res.ok());
  CHECK(res->manifest.step == 1);
  CHECK(back == small);
}

namespace {
/// A python3 with numpy, or empty. Debian's numpy lives in /usr/bin/python3's
/// dist-packages, which a pyenv python3 first on PATH does not see.
std::string python_with_numpy() {
  for (const char* py : {"python3", "/usr/bin/python3"}) {
    std::string cmd = std::string(py) + " -c 'import numpy' >/dev/null 2>&1";
    if (std::system(cmd.c_str()) == 0) return py;
  }
  return {};
}

fs::path checker_script() {
  // GRACE_SOURCE_DIR: the source tree, defined by tests/CMakeLists.txt.
  return fs::path(GRACE_SOURCE_DIR) / "tests/python/check_safetensors.py";
}
}  // namespace

TEST_CASE("an independent numpy reader agrees with the checkpoint", "[checkpoint][python]") {
  auto py = python_with_numpy();
  auto script = checker_script();
  if (py.empty() || !fs::exists(script)) GRACE_SKIP("python3 with numpy or " << script << " not found");
  temp_dir td;
  checkpoint_store store(td.path / "ckpts");
  store.set_shard_bytes(64);  // several shards
  model m(42);
  auto r = store.save(snap(m.refs()), meta_for(9));
  REQUIRE(r.ok());

  // Expected values as raw little-endian files plus a json description.
  nlohmann::json spec;
  for (auto& t : m.refs()) {
    std::string file = t.name + ".bin";
    write_all(td.path / file, std::string(static_cast<const char*>(t.data), t.bytes()));
    spec["tensors"][t.name] = {{"dtype", dtype_name(t.type)}, {"shape", t.shape}, {"file", file}};
  }
  write_all(td.path / "expected.json", spec.dump());
  std::string cmd =
      py + " '" + script.string() + "' '" + r->path.string() + "' '" + (td.path / "expected.json").string() + "'";
  CHECK(std::system(cmd.c_str()) == 0);
  // For trying grace-ckpt by hand on a checkpoint this test wrote.
  if (const char* keep = std::getenv("GRACE_TEST_KEEP_CKPT"))
    fs::copy(td.path / "ckpts", keep, fs::copy_options::recursive | fs::copy_options::overwrite_existing);

  // And it notices a difference.
  m.w[3] += 1.0f;
  write_all(td.path / "layer.w.bin", std::string(reinterpret_cast<const char*>(m.w.data()), 80));
  CHECK(std::system((cmd + " >/dev/null").c_str()) != 0);
}
