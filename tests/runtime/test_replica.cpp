// In-memory replicas of sharded state (runtime/checkpoint/replica.hpp): placement,
// kept copies, transfers between two keepers over loopback, refusals.
// A check that a transfer changed nothing runs once the transfer is known
// to have ended: keep() of the next step waits for the previous transfer
// (runtime/checkpoint/replica.hpp), and its kept copy shows it did not give up.
#include "runtime/checkpoint/replica.hpp"
#include "runtime/net/tcp.hpp"
#include "../temp_dir.hpp"

#include <catch2/catch.hpp>
#include <gloo/rendezvous/hash_store.h>

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <set>
#include <iterator>
#include <thread>

using namespace grace;

TEST_CASE("replicas: placement is a ring on one node, across nodes on several", "[replicas]") {
  // One node (or unknown): the previous rank holds the replica.
  CHECK(replica_holder(0, 4, 4) == 3);
  CHECK(replica_holder(2, 4, 0) == 1);
  CHECK(replica_source(3, 4, 4) == 0);
  // Two nodes of two: the same local rank on the other node.
  CHECK(replica_holder(0, 4, 2) == 2);
  CHECK(replica_holder(3, 4, 2) == 1);
  for (uint32_t w : {2u, 3u, 4u, 8u})
    for (uint32_t lw : {0u, 1u, 2u, 4u, w})
      for (uint32_t r = 0; r < w; ++r) {
        CHECK(replica_source(replica_holder(r, w, lw), w, lw) == r);
        CHECK(replica_holder(r, w, lw) != r);
        if (lw > 0 && lw < w && w % lw == 0) CHECK(replica_holder(r, w, lw) / lw != r / lw);  // another node
      }
  CHECK(replica_holder(0, 1, 1) == 0);  // alone: no replica
}

namespace {

struct member {
  std::vector<float> part;
  std::vector<tensor_ref> layout;
  std::unique_ptr<replica_keeper> keeper;
};

member make_member(uint32_t rank, std::shared_ptr<gloo::rendezvous::Store> kv, const std::string& token,
                   std::shared_ptr<checkpoint_store> mirror = nullptr) {
  member m;
  m.part.assign(1000, 0.0f);
  tensor_ref t;
  t.name = "w";
  t.shape = {10, 100};
  t.global_shape = {20, 100};
  t.offsets = {10 * static_cast<int64_t>(rank), 0};
  t.data = m.part.data();
  m.layout = {t};
  replica_keeper::config c;
  c.rank = rank;
  c.world = 2;
  c.local_world = 2;
  c.host = "127.0.0.1";
  c.token = token;
  c.kv = std::move(kv);
  c.prefix = "test";
  c.io_timeout = std::chrono::milliseconds(2000);
  c.mirror = std::move(mirror);
  auto k = replica_keeper::start(c, m.layout);
  REQUIRE(k);
  m.keeper = std::move(*k);
  return m;
}

void keep(member& m, uint32_t rank, uint64_t step) {
  for (size_t i = 0; i < m.part.size(); ++i) m.part[i] = static_cast<float>(rank * 100000 + step * 1000 + i);
  checkpoint_meta meta;
  meta.step = step;
  meta.counters["steps_done"] = static_cast<int64_t>(step);
  meta.counters["cursor"] = static_cast<int64_t>(rank * 1000 + step);  // per rank
  meta.metadata["grace.blob.rng"] = "rank" + std::to_string(rank) + "-step" + std::to_string(step);
  REQUIRE(m.keeper->keep(step, m.layout, meta));
}

void wait_pushed(const member& m, uint64_t step) {
  for (int i = 0; i < 3000 && m.keeper->pushed_step() < step; ++i)  // 30 s: a hang guard
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  REQUIRE(m.keeper->pushed_step() == step);
}

/// Keeps `step` on `m` once its transfer of the previous copy ended
/// (accepted or refused): keep() waits for it, and a kept copy of `step`
/// shows the wait did not time out instead.
void keep_after_transfer(member& m, uint32_t rank, uint64_t step) {
  keep(m, rank, step);
  REQUIRE(m.keeper->kept(step));
}

}  // namespace

TEST_CASE("replicas: each rank keeps its last steps and the other's newest whole copies", "[replicas]") {
  auto kv = std::make_shared<gloo::rendezvous::HashStore>();
  auto a = make_member(0, kv, "0123456789abcdef0123");
  auto b = make_member(1, kv, "0123456789abcdef0123");
  for (uint64_t s = 1; s <= 5; ++s) {
    keep(a, 0, s);
    keep(b, 1, s);
  }
  wait_pushed(a, 5);
  wait_pushed(b, 5);
  auto ra = a.keeper->freeze();
  CHECK(ra.kept == std::vector<uint64_t>{3, 4, 5});
  REQUIRE(ra.of == 1u);
  CHECK(ra.replica == std::vector<uint64_t>{4, 5});
  // The replica holds rank 1's bytes of step 5, slice included.
  auto rep = a.keeper->replica(5);
  REQUIRE(rep);
  auto v = rep->view();
  REQUIRE(v.size() == 1);
  CHECK(v[0].offsets == std::vector<int64_t>{10, 0});
  CHECK(v[0].global_shape == std::vector<int64_t>{20, 100});
  CHECK(std::memcmp(v[0].data, b.part.data(), v[0].bytes) == 0);
  CHECK_FALSE(a.keeper->replica(3));
  // ... with rank 1's own counters and blobs of step 5.
  auto st = a.keeper->replica_state(5);
  REQUIRE(st);
  CHECK(st->counters == std::map<std::string, int64_t>{{"cursor", 1005}, {"steps_done", 5}});
  CHECK(st->metadata.at("grace.blob.rng") == "rank1-step5");
  CHECK_FALSE(a.keeper->replica_state(3));
  // A kept copy holds its step's bytes and counters.
  auto own = a.keeper->kept(4);
  REQUIRE(own);
  CHECK(own->meta.counters.at("steps_done") == 4);
  CHECK(static_cast<const float*>(own->buffers->view()[0].data)[7] == 4007.0f);
  // Frozen: later steps change nothing, and rank 1's transfer of step 6
  // has ended before that is checked.
  keep(a, 0, 6);
  keep(b, 1, 6);
  keep_after_transfer(b, 1, 7);
  CHECK(b.keeper->pushed_step() == 5);  // refused: never acknowledged
  CHECK(a.keeper->freeze().kept == std::vector<uint64_t>{3, 4, 5});
  CHECK(a.keeper->freeze().replica == std::vector<uint64_t>{4, 5});
  CHECK_FALSE(a.keeper->kept(6));
}

TEST_CASE("replicas: a transfer with a wrong token or from the wrong rank is refused", "[replicas]") {
  auto kv = std::make_shared<gloo::rendezvous::HashStore>();
  auto a = make_member(0, kv, "0123456789abcdef0123");
  // Rank 1 with another job's token: its copies never count at rank 0.
  auto b = make_member(1, kv, "another-job-secret-000");
  keep(b, 1, 1);
  keep_after_transfer(b, 1, 2);  // the transfer of step 1 has ended
  CHECK(b.keeper->pushed() == 0);
  CHECK(a.keeper->freeze().replica.empty());
  // Garbage on the port: the keeper goes on.
  auto v = kv->get("test/replica/0");
  auto fd = tcp::connect_to(std::string(v.begin(), v.end()), std::chrono::milliseconds(1000));
  REQUIRE(fd);
  CHECK(tcp::send_all(*fd, std::string("GET / HTTP/1.0\r\n\r\n")));
  ::close(*fd);
}

namespace {

std::string file_bytes(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

void wait_mirrored(const member& m, uint64_t step) {
  for (int i = 0; i < 3000 && m.keeper->mirrored_step() < step; ++i)  // 30 s: a hang guard
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  REQUIRE(m.keeper->mirrored_step() == step);
}

}  // namespace

TEST_CASE("replicas: the holder mirrors its source's part of a saved step into the memory store, as the source "
          "wrote it", "[replicas]") {
  grace::testing::temp_dir d("grace-mirror");
  auto memory = std::make_shared<checkpoint_store>(d.path / "mem", 0);
  memory->set_direct_io(false);
  auto kv = std::make_shared<gloo::rendezvous::HashStore>();
  auto a = make_member(0, kv, "0123456789abcdef0123", memory);  // holds rank 1's replica
  auto b = make_member(1, kv, "0123456789abcdef0123");
  checkpoint_meta meta;
  meta.step = 5;
  meta.world_size = 2;
  a.keeper->mirror(5, meta, "i0-p");  // before the replica of step 5 arrived: it waits for it
  for (uint64_t s = 1; s <= 5; ++s) keep(b, 1, s);
  wait_mirrored(a, 5);
  auto parts = memory->prepared_parts();
  REQUIRE(parts.size() == 1);
  CHECK(parts[0].step == 5);
  CHECK(parts[0].file == "rank-00002-of-00002.safetensors");
  // Byte for byte the part rank 1 writes itself (the manifest's checksum).
  checkpoint_store own(d.path / "own", 0);
  snapshot_buffers sb(b.layout);
  REQUIRE(sb.capture(b.layout));
  REQUIRE(own.save_part(sb.view(), meta, "i0-p", 1, false));
  CHECK(file_bytes(memory->parts_path(5, "i0-p") / parts[0].file) ==
        file_bytes(own.parts_path(5, "i0-p") / parts[0].file));
  // ... with rank 1's own counters in its description.
  auto desc = memory->part_description(5, "i0-p", 1);
  REQUIRE(desc);
  CHECK(desc->find("\"cursor\":1005") != std::string::npos);
  // The newest two mirrored rounds are kept.
  for (uint64_t s : {7u, 9u}) {
    meta.step = s;
    a.keeper->mirror(s, meta, "i0-p");
    for (uint64_t k = s - 1; k <= s; ++k) keep(b, 1, k);
    wait_mirrored(a, s);
  }
  std::set<uint64_t> steps;
  for (auto& p : memory->prepared_parts()) steps.insert(p.step);
  CHECK(steps == std::set<uint64_t>{7, 9});
}
