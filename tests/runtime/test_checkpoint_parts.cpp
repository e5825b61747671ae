// Sharded checkpoints (runtime/checkpoint/checkpoint_parts.cpp): every rank's part,
// the commit of all parts, and restores that reslice N parts onto M ranks.
#include <catch2/catch.hpp>

#include <algorithm>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/checkpoint/manifest.hpp"
#include "runtime/checkpoint/snapshot.hpp"
#include "../temp_dir.hpp"

namespace fs = std::filesystem;
using namespace grace;

namespace {

constexpr int64_t rows = 10, cols = 3;

/// The global tensors of the test state: `m` [10, 3] (sharded by rows),
/// `w` [4] (replicated). Element values are their global index + `salt`.
std::vector<float> global_m(float salt) {
  std::vector<float> v(rows * cols);
  std::iota(v.begin(), v.end(), salt);
  return v;
}

/// One rank's registered state: its rows of `m` and all of `w`.
struct rank_tensors {
  std::vector<float> m, w = std::vector<float>(4);
  tensor_ref m_ref, w_ref;
  rank_tensors(uint32_t rank, uint32_t world) {
    auto [begin, count] = even_split(rows, rank, world);
    m.assign(static_cast<size_t>(count * cols), -1.f);
    m_ref = {"m", dtype::f32, {count, cols}, m.data()};
    m_ref.global_shape = {rows, cols};
    m_ref.offsets = {begin, 0};
    w_ref = {"w", dtype::f32, {4}, w.data()};
  }
  void fill(float salt) {
    auto g = global_m(salt);
    std::copy(g.begin() + m_ref.offsets[0] * cols, g.begin() + (m_ref.offsets[0] + m_ref.shape[0]) * cols, m.begin());
    for (size_t i = 0; i < w.size(); ++i) w[i] = 100 + salt + static_cast<float>(i);
  }
  std::vector<tensor_ref> refs() const { return {m_ref, w_ref}; }
};

checkpoint_meta meta_of(uint64_t step, int world) {
  checkpoint_meta m;
  m.step = step;
  m.world_size = world;
  m.run_id = "parts-test";
  return m;
}

/// Every rank of `world` writes its part of `step`; rank 0 writes the
/// replicated tensors; `commit`: rank 0 commits.
void save_all(checkpoint_store& store, uint64_t step, uint32_t world, float salt, bool commit = true) {
  for (uint32_t r = 0; r < world; ++r) {
    rank_tensors s(r, world);
    s.fill(salt);
    snapshot_buffers b(s.refs());
    REQUIRE(b.capture(s.refs()));
    auto p = store.save_part(b.view(), meta_of(step, world), "t1", r, r == 0);
    REQUIRE(p);
  }
  if (commit) REQUIRE(store.commit_parts(meta_of(step, world), "t1"));
}

/// Restores the newest checkpoint on every rank of `world` and checks each
/// slice against the global tensor.
void check_restore_on(checkpoint_store& store, uint32_t world, float salt, uint64_t step) {
  const auto want = global_m(salt);
  for (uint32_t r = 0; r < world; ++r) {
    rank_tensors s(r, world);
    auto got = store.restore_latest(s.refs());
    REQUIRE(got);
    REQUIRE(got->found);
    CHECK(got->manifest.step == step);
    std::vector<float> expect(want.begin() + s.m_ref.offsets[0] * cols,
                              want.begin() + (s.m_ref.offsets[0] + s.m_ref.shape[0]) * cols);
    CHECK(s.m == expect);
    CHECK(s.w == std::vector<float>{100 + salt, 101 + salt, 102 + salt, 103 + salt});
  }
}

}  // namespace

TEST_CASE("copy_overlap copies the common box of two slices", "[parts]") {
  // Global [4, 5]; source rows 1..3, all columns; destination rows 2..4, columns 1..3.
  std::vector<int> src(3 * 5), dst(2 * 3, -1);
  std::iota(src.begin(), src.end(), 0);
  auto n = copy_overlap(src.data(), {1, 0}, {3, 5}, dst.data(), {2, 1}, {2, 3}, sizeof(int));
  CHECK(n == 6);
  CHECK(dst == std::vector<int>{6, 7, 8, 11, 12, 13});
  CHECK(copy_overlap(src.data(), {0, 0}, {1, 5}, dst.data(), {2, 1}, {2, 3}, sizeof(int)) == 0);
}

TEST_CASE("even_split gives every row to exactly one rank", "[parts]") {
  for (uint32_t world = 1; world <= 7; ++world) {
    int64_t next = 0;
    for (uint32_t r = 0; r < world; ++r) {
      auto [b, c] = even_split(10, r, world);
      CHECK(b == next);
      next = b + c;
    }
    CHECK(next == 10);
  }
}

TEST_CASE("slice_problem names a slice outside its global tensor", "[parts]") {
  tensor_ref t{"m", dtype::f32, {4, 3}, nullptr};
  CHECK(slice_problem(t).empty());
  t.global_shape = {10, 3};
  t.offsets = {7, 0};
  CHECK(slice_problem(t).find("outside the global shape") != std::string::npos);
  t.offsets = {6};
  CHECK(slice_problem(t).find("number of dimensions") != std::string::npos);
  t.offsets = {6, 0};
  CHECK(slice_problem(t).empty());
}

TEST_CASE("a checkpoint of 4 parts restores on 4, 2, 3 and 1 ranks", "[parts]") {
  grace::testing::temp_dir d("grace-parts");
  checkpoint_store store(d.path / "ck");
  save_all(store, 7, 4, 0.5f);
  CHECK(store.verify(7));
  CHECK(!fs::exists(store.parts_path(7, "t1")));
  auto m = store.read_manifest(store.step_path(7));
  REQUIRE(m);
  CHECK(m->world_size == 4);
  CHECK(m->metadata.at("grace.format") == "sharded");
  CHECK(m->files.size() == 5);  // four part files and the index
  for (uint32_t world : {4u, 2u, 3u, 1u}) check_restore_on(store, world, 0.5f, 7);
}

TEST_CASE("the index tells a reader without Grace where every part lies", "[parts]") {
  grace::testing::temp_dir d("grace-parts");
  checkpoint_store store(d.path / "ck");
  save_all(store, 3, 3, 0);
  std::ifstream in(store.step_path(3) / index_file_name);
  auto j = nlohmann::json::parse(in);
  CHECK(j["weight_map"]["w"] == "rank-00001-of-00003.safetensors");
  auto& parts = j["grace_sharded"]["m"]["parts"];
  REQUIRE(parts.size() == 3);
  CHECK(j["grace_sharded"]["m"]["shape"] == nlohmann::json::array({10, 3}));
  CHECK(parts[1]["file"] == "rank-00002-of-00003.safetensors");
  CHECK(parts[1]["offsets"] == nlohmann::json::array({4, 0}));
  CHECK(parts[1]["shape"] == nlohmann::json::array({3, 3}));
}

TEST_CASE("parts that were never committed leave the previous checkpoint the newest", "[parts]") {
  grace::testing::temp_dir d("grace-parts");
  checkpoint_store store(d.path / "ck");
  save_all(store, 5, 4, 1);
  save_all(store, 6, 4, 2, /*commit=*/false);  // every part durable, the commit never ran
  CHECK(store.newest_valid_step() == 5);
  check_restore_on(store, 4, 1, 5);
  // A commit with a part missing is refused and commits nothing.
  for (uint32_t r = 0; r < 3; ++r) {
    rank_tensors s(r, 4);
    s.fill(3);
    snapshot_buffers b(s.refs());
    REQUIRE(b.capture(s.refs()));
    REQUIRE(store.save_part(b.view(), meta_of(8, 4), "t1", r, r == 0));
  }
  auto c = store.commit_parts(meta_of(8, 4), "t1");
  REQUIRE(!c);
  CHECK(c.err().message.find("rank 3 is not durable") != std::string::npos);
  CHECK(store.newest_valid_step() == 5);
  // The next commit removes the abandoned rounds below it.
  save_all(store, 9, 4, 4);
  CHECK(!fs::exists(store.parts_path(6, "t1")));
  CHECK(!fs::exists(store.parts_path(8, "t1")));
  check_restore_on(store, 2, 4, 9);
}

TEST_CASE("a damaged part falls back to the previous complete checkpoint", "[parts]") {
  grace::testing::temp_dir d("grace-parts");
  checkpoint_store store(d.path / "ck");
  save_all(store, 5, 4, 1);
  save_all(store, 6, 4, 2);
  auto victim = store.step_path(6) / "rank-00003-of-00004.safetensors";
  {
    std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-2, std::ios::end);
    f.put('\x7f');
  }
  auto v = store.verify(6);
  REQUIRE(!v);
  CHECK(v.err().message.find("checksum mismatch") != std::string::npos);
  rank_tensors s(1, 2);
  auto got = store.restore_latest(s.refs());
  REQUIRE(got);
  CHECK(got->manifest.step == 5);
  REQUIRE(got->skipped.size() == 1);
  CHECK(got->skipped[0].step == 6);
}

TEST_CASE("on the same world a rank verifies only the parts it restores, and the owner of a damaged part sets it aside",
          "[parts]") {
  grace::testing::temp_dir d("grace-parts");
  checkpoint_store store(d.path / "ck");
  save_all(store, 5, 4, 1);
  save_all(store, 6, 4, 2);
  {
    std::fstream f(store.step_path(6) / "rank-00004-of-00004.safetensors",
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-2, std::ios::end);
    f.put('\x7f');
  }
  // Rank 1 reads rank 0's part (the replicated `w`) and its own: step 6.
  rank_tensors r1(1, 4);
  auto got = store.restore_latest(r1.refs());
  REQUIRE(got);
  CHECK(got->manifest.step == 6);
  CHECK(got->skipped.empty());
  // Rank 3 finds its part damaged: without set-aside it skips step 6 only.
  rank_tensors r3(3, 4);
  got = store.restore_latest(r3.refs());
  REQUIRE(got);
  CHECK(got->manifest.step == 5);
  CHECK(fs::exists(store.step_path(6)));
  // With set-aside (a session's store) step 6 is moved aside, so every
  // rank agrees on step 5 at the next restore.
  store.set_aside_damaged_on_restore(true);
  got = store.restore_latest(r3.refs());
  REQUIRE(got);
  CHECK(got->manifest.step == 5);
  CHECK(!fs::exists(store.step_path(6)));
  int aside = 0;
  for (auto& e : fs::directory_iterator(d.path / "ck"))
    aside += e.path().filename().string().rfind("step-0000000006.corrupt-", 0) == 0;
  CHECK(aside == 1);
  check_restore_on(store, 4, 1, 5);
}

TEST_CASE("a restore whose global shape differs is the caller's error and writes nothing", "[parts]") {
  grace::testing::temp_dir d("grace-parts");
  checkpoint_store store(d.path / "ck");
  save_all(store, 5, 2, 1);
  std::vector<float> m(3 * 3, -1.f), w(4, -1.f);
  tensor_ref mr{"m", dtype::f32, {3, 3}, m.data()};
  mr.global_shape = {12, 3};
  mr.offsets = {0, 0};
  tensor_ref wr{"w", dtype::f32, {4}, w.data()};
  auto got = store.restore_latest({mr, wr});
  REQUIRE(!got);
  CHECK(got.err().message.find("checkpoint has F32 [10,3]") != std::string::npos);
  CHECK(w == std::vector<float>(4, -1.f));
}

TEST_CASE("an unsharded checkpoint restores into slices", "[parts]") {
  grace::testing::temp_dir d("grace-parts");
  checkpoint_store store(d.path / "ck");
  auto g = global_m(2);
  std::vector<float> w{102, 103, 104, 105};
  std::vector<tensor_ref> whole{{"m", dtype::f32, {rows, cols}, g.data()}, {"w", dtype::f32, {4}, w.data()}};
  snapshot_buffers b(whole);
  REQUIRE(b.capture(whole));
  REQUIRE(store.save(b.view(), meta_of(4, 1)));
  check_restore_on(store, 3, 2, 4);
}

TEST_CASE("parts that overlap are refused at commit", "[parts]") {
  grace::testing::temp_dir d("grace-parts");
  checkpoint_store store(d.path / "ck");
  for (uint32_t r = 0; r < 2; ++r) {
    rank_tensors s(0, 2);  // both ranks claim the first rows
    s.fill(0);
    snapshot_buffers b(s.refs());
    REQUIRE(b.capture(s.refs()));
    REQUIRE(store.save_part(b.view(), meta_of(2, 2), "t1", r, r == 0));
  }
  auto c = store.commit_parts(meta_of(2, 2), "t1");
  REQUIRE(!c);
  CHECK(c.err().message.find("overlap") != std::string::npos);
  CHECK(store.newest_valid_step() == 0);
}

TEST_CASE("a sharded checkpoint keeps each rank's own counters and blobs", "[parts]") {
  grace::testing::temp_dir d;
  checkpoint_store store(d.path / "ck", 3);
  const uint32_t world = 3;
  for (uint32_t r = 0; r < world; ++r) {
    rank_tensors s(r, world);
    s.fill(1);
    snapshot_buffers b(s.refs());
    REQUIRE(b.capture(s.refs()));
    auto meta = meta_of(5, world);
    meta.counters = {{"epoch", 2}, {"rng_offset", 10 + r}};                       // rng_offset differs per rank
    meta.metadata = {{"grace.blob.rng", r == 2 ? "cmFuazI=" : "c2FtZQ=="},         // rank 2's blob differs
                     {"grace.saved_by_rank", std::to_string(r)}};                 // differs, never kept per rank
    // Rank 1's part records no state of its own (with_rank_state false).
    REQUIRE(store.save_part(b.view(), meta, "t1", r, r == 0, {}, r != 1));
  }
  auto commit = meta_of(5, world);
  commit.counters = {{"epoch", 2}, {"rng_offset", 10}};
  commit.metadata = {{"grace.blob.rng", "c2FtZQ=="}, {"grace.saved_by_rank", "0"}};
  REQUIRE(store.commit_parts(commit, "t1"));
  auto m = store.read_manifest(store.step_path(5));
  REQUIRE(m);
  // Only what differs from the committer's, rank 2's offset and blob, in
  // a file of rank 2's own: the manifest names it and lists its checksum.
  CHECK(m->ranks.empty());
  CHECK(m->format_version == 2);
  REQUIRE(m->rank_files == std::map<uint32_t, std::string>{{2, "rank-00003-of-00003.state.json"}});
  CHECK(std::count_if(m->files.begin(), m->files.end(),
                      [](const checkpoint_file& f) { return f.name == "rank-00003-of-00003.state.json"; }) == 1);
  auto diff2 = store.read_rank_state(store.step_path(5), *m, 2);
  REQUIRE(diff2);
  CHECK(diff2->counters == std::map<std::string, int64_t>{{"rng_offset", 12}});
  CHECK(diff2->metadata == std::map<std::string, std::string>{{"grace.blob.rng", "cmFuazI="}});

  // A restore resolves the restoring rank's own state.
  auto restore_as = [&](uint32_t r, uint32_t w) {
    checkpoint_store reader(d.path / "ck", 3);
    reader.set_restoring_rank(r, static_cast<int>(w));
    rank_tensors t(r, w);
    auto got = reader.restore_latest(t.refs());
    REQUIRE(got);
    REQUIRE(got->found);
    return got->own;
  };
  auto own2 = restore_as(2, 3);
  CHECK(own2.counters.at("epoch") == 2);
  CHECK(own2.counters.at("rng_offset") == 12);
  CHECK(own2.metadata.at("grace.blob.rng") == "cmFuazI=");
  CHECK(restore_as(0, 3).counters.at("rng_offset") == 10);
  CHECK(restore_as(1, 3).counters.at("rng_offset") == 10);  // none of its own: the committer's
  // Restored on another world size, every rank takes the committer's.
  auto on_two = restore_as(1, 2);
  CHECK(on_two.counters.at("rng_offset") == 10);
  CHECK(on_two.metadata.at("grace.blob.rng") == "c2FtZQ==");

  // Rank 2's state file damaged: rank 2's restore finds the step corrupt
  // and moves it aside; no rank restores it afterwards.
  {
    std::fstream f(store.step_path(5) / "rank-00003-of-00003.state.json", std::ios::in | std::ios::out);
    f.seekp(3);
    f.put('#');
  }
  checkpoint_store reader(d.path / "ck", 3);
  reader.set_restoring_rank(2, 3);
  reader.set_aside_damaged_on_restore(true);
  rank_tensors t2(2, 3);
  auto got = reader.restore_latest(t2.refs());
  REQUIRE(got);
  CHECK_FALSE(got->found);
  REQUIRE(got->skipped.size() == 1);
  CHECK_THAT(got->skipped[0].reason, Catch::Contains("rank-00003-of-00003.state.json"));
  CHECK_FALSE(fs::exists(store.step_path(5)));
}

TEST_CASE("a manifest's per-rank entries must name ranks of its world", "[parts]") {
  grace::testing::temp_dir d;
  auto p = d.path / "m.json";
  nlohmann::json base = {{"format", "grace-checkpoint"}, {"format_version", 1}, {"step", 3u}, {"world_size", 2},
                         {"run_id", "x"}, {"incarnation", 0u}, {"kind", "periodic"}, {"wall_time", 1.0},
                         {"files", nlohmann::json::array()}};
  for (auto& [bad, why] : std::vector<std::pair<nlohmann::json, std::string>>{
           {{{"2", nlohmann::json::object()}}, "not a rank of the world"},
           {{{"-1", nlohmann::json::object()}}, "not a rank of the world"},
           {{{"1x", nlohmann::json::object()}}, "not a rank of the world"},
           {{{"1", 5}}, "is not an object"},
           {{{"1", {{"counters", {{"a", "b"}}}}}}, "is not a 64-bit integer"},
           {{{"1", {{"counters", {{"a", 18446744073709551615ull}}}}}}, "is not a 64-bit integer"},
           {{{"1", {{"counters", {{"a", 1.5}}}}}}, "is not a 64-bit integer"},
           {nlohmann::json::array(), "ranks is not an object"},
           {{{"1", {{"file", "../x"}}}}, "must be {\"file\": \"rank-00002-of-00002.state.json\"}"},
           {{{"1", {{"file", 3}}}}, "must be {\"file\""},
           {{{"1", {{"file", "rank-00001-of-00002.safetensors"}}}}, "must be {\"file\""},
           {{{"1", {{"file", "rank-00002-of-00002.state.json"}, {"counters", nlohmann::json::object()}}}},
            "must be {\"file\""}}) {
    auto j = base;
    j["ranks"] = bad;
    auto m = manifest_from_json(p, j);
    REQUIRE_FALSE(m);
    INFO(m.err().message);
    CHECK(m.err().message.find(why) != std::string::npos);
  }
  auto j = base;
  j["ranks"] = {{"1", {{"counters", {{"a", 7}}}}}};
  auto m = manifest_from_json(p, j);
  REQUIRE(m);
  CHECK(m->ranks.at(1).counters.at("a") == 7);
  auto back = manifest_from_json(p, manifest_to_json(*m));  // round trip
  REQUIRE(back);
  CHECK(back->ranks.at(1).counters.at("a") == 7);

  // A state file: only in format_version 2, and listed in files.
  j = base;
  j["ranks"] = {{"1", {{"file", "rank-00002-of-00002.state.json"}}}};
  m = manifest_from_json(p, j);
  REQUIRE_FALSE(m);
  CHECK_THAT(m.err().message, Catch::Contains("in format_version 2 and later"));
  j["format_version"] = 2;
  m = manifest_from_json(p, j);
  REQUIRE_FALSE(m);
  CHECK_THAT(m.err().message, Catch::Contains("does not list it in files"));
  j["files"] = {{{"name", "rank-00002-of-00002.state.json"}, {"size", 10u}, {"xxh3", "0000000000000000"}}};
  m = manifest_from_json(p, j);
  REQUIRE(m);
  CHECK(m->rank_files.at(1) == "rank-00002-of-00002.state.json");
  back = manifest_from_json(p, manifest_to_json(*m));
  REQUIRE(back);
  CHECK(back->rank_files == m->rank_files);
  j["format_version"] = checkpoint_manifest::current_format_version + 1;
  CHECK_FALSE(manifest_from_json(p, j));
}

namespace {

/// World 4 on two nodes with a directory each: ranks 0 and 1 write their
/// parts of round "t1" of `step` into `a`, ranks 2 and 3 into `b`; returns
/// every rank's part description.
std::vector<std::string> write_node_local_parts(checkpoint_store& a, checkpoint_store& b, uint64_t step, float salt) {
  std::vector<std::string> descs;
  for (uint32_t r = 0; r < 4; ++r) {
    auto& store = r < 2 ? a : b;
    rank_tensors s(r, 4);
    s.fill(salt);
    snapshot_buffers buf(s.refs());
    REQUIRE(buf.capture(s.refs()));
    REQUIRE(store.save_part(buf.view(), meta_of(step, 4), "t1", r, r == 0));
    auto d = store.part_description(step, "t1", r);
    REQUIRE(d);
    descs.push_back(*d);
  }
  return descs;
}

/// The parts of write_node_local_parts, committed by both nodes.
void save_node_local(checkpoint_store& a, checkpoint_store& b, uint64_t step, float salt) {
  const auto descs = write_node_local_parts(a, b, step, salt);
  const std::vector<int32_t> holders{0, 0, 1, 1};
  REQUIRE(a.commit_node_parts(meta_of(step, 4), "t1", descs, holders, 0));
  REQUIRE(b.commit_node_parts(meta_of(step, 4), "t1", descs, holders, 1));
}

void copy_part(const checkpoint_store& from, const checkpoint_store& to, uint64_t step, const std::string& name) {
  fs::copy_file(from.step_path(step) / name, to.step_path(step) / name);
}

}  // namespace

TEST_CASE("node-local parts: a node that committed first still gives its part descriptions to a later committer",
          "[parts]") {
  grace::testing::temp_dir d("grace-parts");
  checkpoint_store a(d.path / "node0"), b(d.path / "node1");
  const auto descs = write_node_local_parts(a, b, 5, 0.25f);
  const std::vector<int32_t> holders{0, 0, 1, 1};
  REQUIRE(b.commit_node_parts(meta_of(5, 4), "t1", descs, holders, 1));
  // Node 0's committer gathers only now: node 1's parts directory is its step.
  CHECK(!fs::exists(b.parts_path(5, "t1")));
  auto theirs = b.part_descriptions(5, "t1");
  REQUIRE(theirs);
  std::vector<std::string> want{descs[2], descs[3]}, got = *theirs;
  for (auto& t : want) t = nlohmann::json::parse(t).dump();
  std::sort(got.begin(), got.end());
  std::sort(want.begin(), want.end());
  CHECK(got == want);
  CHECK(b.prepared_parts().empty());
  auto own = a.part_descriptions(5, "t1");
  REQUIRE(own);
  REQUIRE(own->size() == 2);
  REQUIRE(a.commit_node_parts(meta_of(5, 4), "t1", descs, holders, 0));
  CHECK(a.verify(5));
  CHECK(b.verify(5));
  // The kept copies go with the round's parts directories.
  b.remove_parts_up_to(5);
  auto none = b.part_descriptions(5, "t1");
  REQUIRE(none);
  CHECK(none->empty());
}

TEST_CASE("node-local parts: every node commits the global manifest beside the parts it holds", "[parts]") {
  grace::testing::temp_dir d("grace-parts");
  checkpoint_store a(d.path / "node0"), b(d.path / "node1");
  save_node_local(a, b, 7, 0.5f);
  for (auto* s : {&a, &b}) {
    CHECK(s->verify(7));
    CHECK(s->newest_valid_step() == 7);
    CHECK(!fs::exists(s->parts_path(7, "t1")));
    auto m = s->read_manifest(s->step_path(7));
    REQUIRE(m);
    CHECK(m->format_version == 3);
    CHECK(m->node_local());
    std::map<std::string, int32_t> where;
    for (auto& f : m->files) where[f.name] = f.node;
    CHECK(where == std::map<std::string, int32_t>{{"rank-00001-of-00004.safetensors", 0},
                                                   {"rank-00002-of-00004.safetensors", 0},
                                                   {"rank-00003-of-00004.safetensors", 1},
                                                   {"rank-00004-of-00004.safetensors", 1},
                                                   {index_file_name, -1}});
  }
  CHECK(fs::exists(a.step_path(7) / "rank-00002-of-00004.safetensors"));
  CHECK(!fs::exists(a.step_path(7) / "rank-00003-of-00004.safetensors"));
  CHECK(fs::exists(b.step_path(7) / "rank-00004-of-00004.safetensors"));
  CHECK(!fs::exists(b.step_path(7) / "rank-00001-of-00004.safetensors"));
  // Node 0's ranks restore from their own directory.
  for (uint32_t r = 0; r < 2; ++r) {
    rank_tensors s(r, 4);
    auto got = a.restore_latest(s.refs());
    REQUIRE(got);
    CHECK(got->manifest.step == 7);
  }
}

TEST_CASE("node-local parts: a restore that needs a part held on another node names it, and works once it is copied",
          "[parts]") {
  grace::testing::temp_dir d("grace-parts");
  checkpoint_store a(d.path / "node0"), b(d.path / "node1");
  save_node_local(a, b, 7, 0.5f);
  // Rank 2 needs the replicated `w`, in rank 0's part on node 0.
  rank_tensors s(2, 4);
  auto got = b.restore_latest(s.refs());
  REQUIRE(!got);
  CHECK(got.err().message.find("needs rank-00001-of-00004.safetensors, held on node 0") != std::string::npos);
  CHECK(s.m == std::vector<float>(s.m.size(), -1.f));  // nothing written into the caller's memory
  CHECK(b.verify(7));                                   // and nothing set aside
  copy_part(a, b, 7, "rank-00001-of-00004.safetensors");
  CHECK(b.verify(7));
  for (uint32_t r = 2; r < 4; ++r) {
    rank_tensors got_r(r, 4), want(r, 4);
    want.fill(0.5f);  // what the rank held when it saved
    REQUIRE(b.restore_latest(got_r.refs()));
    CHECK(got_r.m == want.m);
    CHECK(got_r.w == want.w);
  }
  // On two ranks, rank 1 (rows 5-9) needs rows held on node 1.
  rank_tensors half(1, 2);
  auto resliced = a.restore_latest(half.refs());
  REQUIRE(!resliced);
  CHECK(resliced.err().message.find("held on node 1") != std::string::npos);
  copy_part(b, a, 7, "rank-00003-of-00004.safetensors");
  copy_part(b, a, 7, "rank-00004-of-00004.safetensors");
  check_restore_on(a, 2, 0.5f, 7);
}

TEST_CASE("node-local parts: a copied part that does not match the manifest fails verification", "[parts]") {
  grace::testing::temp_dir d("grace-parts");
  checkpoint_store a(d.path / "node0"), b(d.path / "node1");
  save_node_local(a, b, 7, 0.5f);
  copy_part(a, b, 7, "rank-00001-of-00004.safetensors");
  {
    std::fstream f(b.step_path(7) / "rank-00001-of-00004.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-2, std::ios::end);
    f.put('\x7f');
  }
  auto v = b.verify(7);
  REQUIRE(!v);
  CHECK(v.err().message.find("checksum mismatch") != std::string::npos);
  CHECK(a.verify(7));
}

TEST_CASE("node-local parts: a node commit refuses a missing local part and bad descriptions", "[parts]") {
  grace::testing::temp_dir d("grace-parts");
  checkpoint_store a(d.path / "node0");
  std::vector<std::string> descs;
  for (uint32_t r = 0; r < 2; ++r) {
    rank_tensors s(r, 2);
    s.fill(1);
    snapshot_buffers buf(s.refs());
    REQUIRE(buf.capture(s.refs()));
    REQUIRE(a.save_part(buf.view(), meta_of(4, 2), "t1", r, r == 0));
    descs.push_back(*a.part_description(4, "t1", r));
  }
  auto wrong_holder = a.commit_node_parts(meta_of(4, 2), "t1", descs, {0, -1}, 0);
  REQUIRE(!wrong_holder);
  CHECK(wrong_holder.err().message.find("no holder") != std::string::npos);
  auto garbled = a.commit_node_parts(meta_of(4, 2), "t1", {descs[0], "{not json"}, {0, 0}, 0);
  REQUIRE(!garbled);
  CHECK(garbled.err().message.find("not valid JSON") != std::string::npos);
  auto swapped = a.commit_node_parts(meta_of(4, 2), "t1", {descs[1], descs[0]}, {0, 0}, 0);
  REQUIRE(!swapped);
  CHECK(swapped.err().message.find("another step, rank or world size") != std::string::npos);
  fs::remove(a.parts_path(4, "t1") / "rank-00002-of-00002.safetensors");
  auto missing = a.commit_node_parts(meta_of(4, 2), "t1", descs, {0, 0}, 0);
  REQUIRE(!missing);
  CHECK(missing.err().message.find("rank-00002-of-00002.safetensors") != std::string::npos);
  CHECK(a.newest_valid_step() == 0);
  // Held on another node, the same part is not needed here.
  REQUIRE(a.commit_node_parts(meta_of(4, 2), "t1", descs, {0, 1}, 0));
  CHECK(a.verify(4));
}

TEST_CASE("a manifest names a part's node only in format_version 3 and only for parts", "[parts]") {
  grace::testing::temp_dir d("grace-parts");
  auto parse = [&](int version, const std::string& name) {
    nlohmann::json file{{"name", name}, {"size", 1u}, {"xxh3", "0000000000000000"}, {"node", 1u}};
    nlohmann::json j{{"format", "grace-checkpoint"}, {"format_version", version}, {"step", 1u}, {"world_size", 2},
                     {"kind", "periodic"}, {"files", nlohmann::json::array({file})}};
    return manifest_from_json(d.path / "m.json", j);
  };
  auto ok = parse(3, "rank-00002-of-00002.safetensors");
  REQUIRE(ok);
  CHECK(ok->files[0].node == 1);
  CHECK(ok->node_local());
  CHECK(!parse(2, "rank-00002-of-00002.safetensors"));
  CHECK(!parse(3, "model.safetensors.index.json"));
  auto back = manifest_from_json(d.path / "m.json", manifest_to_json(*ok));
  INFO((back ? std::string() : back.err().message));
  REQUIRE(back);
  CHECK(back->files[0].node == 1);
}
