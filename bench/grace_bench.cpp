// grace-bench: micro benchmarks of Grace's plain-C++ parts and of the machine
// they run on, one mode per invocation; bench/run drives them and prints the
// table. Every mode prints one JSON object per line on stdout (`"row"` plus
// numbers), so the driver never parses prose.
//
//   grace-bench rtt --iters 20000 [--busy]        loopback TCP round trip
//   grace-bench agreement --members 256 --reps 200 grace::agreement, claim -> agreed
//   grace-bench ckpt --bytes B --dir D [--shard-bytes S] [--cold-staging]  checkpoint_store save, cold restore
//   grace-bench snapshot --bytes B --reps 7        snapshot capture vs memcpy
//   grace-bench odirect --bytes B --dir D          prototype O_DIRECT writer (proposed fix)
//   grace-bench allreduce --rank R --size 2 --store DIR --floats a,b --reps 10
//   grace-bench gate --reps 2000                  bulk channel connection setup: gate vs plain TCP
//
// Linked against grace_core only (no CAF): see grace_bench_actors.cpp for
// the parts that need the actor system.
#include "runtime/coordination/agreement.hpp"
#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/train/gloo_comm.hpp"
#include "runtime/checkpoint/snapshot.hpp"
#include "runtime/net/bulk_channel.hpp"
#include "runtime/net/tcp.hpp"

#include <gloo/rendezvous/file_store.h>
#include <spdlog/spdlog.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

using clk = std::chrono::steady_clock;

double secs(clk::time_point a, clk::time_point b) { return std::chrono::duration<double>(b - a).count(); }

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// --key value pairs (flags without a value get "1").
std::map<std::string, std::string> parse(int argc, char** argv, int first) {
  std::map<std::string, std::string> m;
  for (int i = first; i < argc; ++i) {
    std::string k = argv[i];
    if (k.rfind("--", 0) != 0) continue;
    k = k.substr(2);
    if (i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0)
      m[k] = argv[++i];
    else
      m[k] = "1";
  }
  return m;
}

uint64_t get_u(const std::map<std::string, std::string>& m, const char* k, uint64_t def) {
  auto it = m.find(k);
  return it == m.end() ? def : std::strtoull(it->second.c_str(), nullptr, 10);
}

std::string get_s(const std::map<std::string, std::string>& m, const char* k, std::string def) {
  auto it = m.find(k);
  return it == m.end() ? def : it->second;
}

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "grace-bench: %s\n", what.c_str());
  std::exit(2);
}

// ------------------------------------------------------------------ rtt

/// Spinning children keep both CPUs busy (no idle wake-up on either side).
std::vector<pid_t> spin_cpus(int n) {
  std::vector<pid_t> pids;
  for (int i = 0; i < n; ++i) {
    pid_t p = ::fork();
    if (p == 0) {
      volatile uint64_t x = 0;
      for (;;) x = x + 1;
    }
    pids.push_back(p);
  }
  return pids;
}

int mode_rtt(const std::map<std::string, std::string>& a) {
  const uint64_t iters = get_u(a, "iters", 20000);
  const bool busy = a.count("busy");
  int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  if (::bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(lfd, 1) != 0)
    die("rtt: bind/listen failed");
  socklen_t len = sizeof addr;
  ::getsockname(lfd, reinterpret_cast<sockaddr*>(&addr), &len);
  pid_t echo = ::fork();
  if (echo == 0) {
    int c = ::accept(lfd, nullptr, nullptr);
    int one = 1;
    ::setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    char b;
    while (::read(c, &b, 1) == 1)
      if (::write(c, &b, 1) != 1) break;
    ::_exit(0);
  }
  ::close(lfd);
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) die("rtt: connect failed");
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  std::vector<pid_t> spinners;
  if (busy) spinners = spin_cpus(2);
  std::vector<double> us;
  us.reserve(iters);
  char b = 'x';
  for (uint64_t i = 0; i < iters + 200; ++i) {
    auto t0 = clk::now();
    if (::write(fd, &b, 1) != 1 || ::read(fd, &b, 1) != 1) die("rtt: ping-pong failed");
    auto t1 = clk::now();
    if (i >= 200) us.push_back(secs(t0, t1) * 1e6);
    // Idle: let the peer's CPU go idle between pings, as between protocol
    // messages (a wake-up is part of the cost there).
    if (!busy) ::usleep(200);
  }
  for (auto p : spinners) ::kill(p, SIGKILL);
  for (auto p : spinners) ::waitpid(p, nullptr, 0);
  ::close(fd);
  ::waitpid(echo, nullptr, 0);
  std::sort(us.begin(), us.end());
  std::printf("{\"row\":\"rtt\",\"busy\":%d,\"median_us\":%.2f,\"p10_us\":%.2f,\"p90_us\":%.2f,\"n\":%zu}\n",
              busy ? 1 : 0, median(us), us[us.size() / 10], us[us.size() * 9 / 10], us.size());
  return 0;
}

// ------------------------------------------------------------------ agreement

int mode_agreement(const std::map<std::string, std::string>& a) {
  const uint32_t members = static_cast<uint32_t>(get_u(a, "members", 256));
  const uint64_t reps = get_u(a, "reps", 200);
  std::vector<double> ns;
  size_t sink = 0;
  for (uint64_t r = 0; r < reps; ++r) {
    grace::agreement ag(members);
    for (uint32_t m = 0; m < members; ++m) ag.on_join(m, 100);
    auto t0 = clk::now();
    auto acts = ag.on_claim(1, 105, 0);
    uint64_t id = ag.current_id();
    sink += acts.size();
    for (uint32_t m = 0; m < members; ++m) sink += ag.on_ack(m, id, 105 + (m & 1)).size();
    auto t1 = clk::now();
    if (ag.phase() != grace::agreement_phase::saving) die("agreement: not agreed after every ack");
    ns.push_back(secs(t0, t1) * 1e9);
  }
  std::printf("{\"row\":\"agreement\",\"members\":%u,\"median_ns\":%.0f,\"reps\":%llu,\"sink\":%zu}\n", members,
              median(ns), (unsigned long long)reps, sink % 7);
  return 0;
}

// ------------------------------------------------------------------ checkpoint

/// Drops the file's clean pages from the page cache (only this file: the
/// machine is shared, so no global drop_caches).
void evict(const std::filesystem::path& p) {
  int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

int mode_ckpt(const std::map<std::string, std::string>& a) {
  const uint64_t bytes = get_u(a, "bytes", 256ull << 20);
  const std::filesystem::path dir = get_s(a, "dir", "/tmp/grace-bench-ckpt");
  const int ntensors = 4;  // like a few large layers
  const size_t per = bytes / ntensors;
  std::vector<std::unique_ptr<float[]>> data;
  std::vector<grace::snapshot_tensor> snap;
  std::vector<grace::tensor_ref> refs;
  for (int i = 0; i < ntensors; ++i) {
    size_t n = per / sizeof(float);
    data.emplace_back(new float[n]);
    float* p = data.back().get();
    for (size_t j = 0; j < n; ++j) p[j] = static_cast<float>(j % 1021) * 0.5f + static_cast<float>(i);
    std::string name = "layers." + std::to_string(i) + ".weight";
    std::vector<int64_t> shape{static_cast<int64_t>(n / 1024), 1024};
    snap.push_back({name, grace::dtype::f32, shape, p, n * sizeof(float)});
    refs.push_back({name, grace::dtype::f32, shape, p});
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  grace::checkpoint_store store(dir, 1);
  if (a.count("shard-bytes")) store.set_shard_bytes(get_u(a, "shard-bytes", 0));
  grace::checkpoint_meta meta;
  meta.step = 1;
  meta.kind = grace::checkpoint_kind::manual;
  // As a session does at attach (its writer thread): the I/O staging
  // resident before the first save. --cold-staging skips it.
  if (!a.count("cold-staging")) store.prepare_io(bytes);
  auto t0 = clk::now();
  auto r = store.save(snap, meta);
  auto t1 = clk::now();
  if (!r) die("ckpt: save failed: " + r.err().message);
  const double save_s = secs(t0, t1);
  // Cold restore: the files' pages evicted, then verify (read + xxh3) and load.
  for (auto& f : std::filesystem::directory_iterator(r->path)) evict(f.path());
  for (auto& d : data) std::memset(d.get(), 0, per);  // the restore must bring the bytes back
  // As a session restores: into its snapshot buffers (allocated and
  // pre-faulted at attach for the saves anyway, so not timed), then into
  // the tensors once every checksum matched.
  grace::snapshot_buffers staging(refs);
  auto t2 = clk::now();
  auto rr = store.restore_latest(refs, staging.regions());
  auto t3 = clk::now();
  if (!rr || !rr->found) die("ckpt: restore failed");
  for (int i = 0; i < ntensors; ++i)
    if (data[i][per / sizeof(float) - 1] != static_cast<float>((per / sizeof(float) - 1) % 1021) * 0.5f + i)
      die("ckpt: restored bytes differ");
  const double restore_s = secs(t2, t3);
  std::printf(
      "{\"row\":\"ckpt\",\"bytes\":%llu,\"save_s\":%.4f,\"write_s\":%.4f,\"fsync_s\":%.4f,"
      "\"save_gbps\":%.4f,\"restore_s\":%.4f,\"restore_gbps\":%.4f}\n",
      (unsigned long long)bytes, save_s, r->write_seconds, r->fsync_seconds, bytes / save_s / 1e9, restore_s,
      bytes / restore_s / 1e9);
  if (!a.count("keep")) std::filesystem::remove_all(dir, ec);
  return 0;
}

// ------------------------------------------------------------------ O_DIRECT prototype

/// What checkpoint_store::save could do (a prototype for the proposed fix,
/// not Grace's format code): the same bytes, from 4096-aligned buffers (as
/// snapshot_buffers are), written with O_DIRECT in 64 MiB chunks by
/// `threads` writers (chunks in flight), hashed with xxh3 on the calling
/// thread meanwhile, space reserved with fallocate, then fdatasync and a
/// directory fsync. The header stands in for a safetensors header padded to
/// 4096 bytes (the format allows trailing spaces in the header).
int mode_odirect(const std::map<std::string, std::string>& a) {
  const uint64_t bytes = get_u(a, "bytes", 256ull << 20);
  const int threads = static_cast<int>(get_u(a, "threads", 2));
  const std::filesystem::path dir = get_s(a, "dir", "/tmp/grace-bench-odirect");
  constexpr size_t chunk = 64u << 20, align = 4096;
  const size_t total = align + bytes;
  void* mem = nullptr;
  if (::posix_memalign(&mem, align, total) != 0) die("odirect: out of memory");
  auto* base = static_cast<unsigned char*>(mem);
  std::memset(base, ' ', align);
  for (size_t i = align; i < total; i += 4096) base[i] = static_cast<unsigned char>(i >> 12);
  std::filesystem::create_directories(dir);
  auto file = dir / "model-00001-of-00001.safetensors";
  std::filesystem::remove(file);
  auto t0 = clk::now();
  int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_DIRECT | O_CLOEXEC, 0644);
  if (fd < 0) die("odirect: open failed: " + std::string(std::strerror(errno)));
  ::fallocate(fd, 0, 0, static_cast<off_t>(total));
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::vector<std::thread> ws;
  for (int t = 0; t < threads; ++t)
    ws.emplace_back([&] {
      for (;;) {
        size_t off = next.fetch_add(chunk);
        if (off >= total) return;
        size_t n = std::min(chunk, total - off);
        size_t done = 0;
        while (done < n) {
          ssize_t r = ::pwrite(fd, base + off + done, n - done, static_cast<off_t>(off + done));
          if (r <= 0) {
            if (r < 0 && errno == EINTR) continue;
            failed = true;
            return;
          }
          done += static_cast<size_t>(r);
        }
      }
    });
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  for (size_t off = 0; off < total; off += chunk) XXH3_64bits_update(st, base + off, std::min(chunk, total - off));
  uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  for (auto& w : ws) w.join();
  if (failed) die("odirect: write failed");
  ::fdatasync(fd);
  ::close(fd);
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  ::fsync(dfd);
  ::close(dfd);
  auto t1 = clk::now();
  std::printf("{\"row\":\"odirect\",\"bytes\":%llu,\"threads\":%d,\"save_s\":%.4f,\"save_gbps\":%.4f,\"h\":%llu}\n",
              (unsigned long long)bytes, threads, secs(t0, t1), bytes / secs(t0, t1) / 1e9,
              (unsigned long long)(h % 1000));
  std::free(mem);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return 0;
}

// ------------------------------------------------------------------ snapshot

/// `ntensors` f32 tensors of bytes/ntensors each, filled, with their refs.
struct f32_state {
  std::vector<std::unique_ptr<float[]>> data;
  std::vector<grace::tensor_ref> refs;
  f32_state(uint64_t bytes, int ntensors) {
    const size_t n = bytes / ntensors / sizeof(float);
    for (int i = 0; i < ntensors; ++i) {
      data.emplace_back(new float[n]);
      for (size_t j = 0; j < n; ++j) data.back()[j] = static_cast<float>(j % 1021) + static_cast<float>(i);
      refs.push_back({"layers." + std::to_string(i) + ".weight", grace::dtype::f32, {static_cast<int64_t>(n)},
                      data.back().get()});
    }
  }
};

int mode_snapshot(const std::map<std::string, std::string>& a) {
  const uint64_t bytes = get_u(a, "bytes", 256ull << 20);
  const uint64_t reps = get_u(a, "reps", 7);
  const int ntensors = 4;
  const size_t per = bytes / ntensors;
  f32_state state(bytes, ntensors);
  auto& data = state.data;
  auto& refs = state.refs;
  grace::snapshot_buffers buf(refs);
  // The baseline: one memcpy of the same bytes into memory that was touched
  // before (warm), as the snapshot buffers are.
  std::unique_ptr<char[]> warm(new char[bytes]);
  std::memset(warm.get(), 1, bytes);
  std::vector<double> cap, cpy;
  for (uint64_t r = 0; r < reps; ++r) {
    auto t0 = clk::now();
    auto st = buf.capture(refs);
    auto t1 = clk::now();
    if (!st) die("snapshot: capture failed: " + st.err().message);
    for (int i = 0; i < ntensors; ++i) std::memcpy(warm.get() + i * per, data[i].get(), per);
    auto t2 = clk::now();
    cap.push_back(secs(t0, t1));
    cpy.push_back(secs(t1, t2));
  }
  std::printf("{\"row\":\"snapshot\",\"bytes\":%llu,\"capture_ms\":%.3f,\"memcpy_ms\":%.3f}\n",
              (unsigned long long)bytes, median(cap) * 1e3, median(cpy) * 1e3);
  return 0;
}

// ------------------------------------------------------------------ syncsave

/// A save the trainer waits for, from the capture's start to the commit:
/// capture then write (the periodic path) against the write started while
/// the capture runs (the path of preemption, just-in-time and final saves).
/// Alternated per rep, same state, same directory.
int mode_syncsave(const std::map<std::string, std::string>& a) {
  const uint64_t bytes = get_u(a, "bytes", 256ull << 20);
  const uint64_t reps = get_u(a, "reps", 5);
  const std::filesystem::path dir = get_s(a, "dir", "/tmp/grace-bench-syncsave");
  f32_state state(bytes, 8);
  auto& refs = state.refs;
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  grace::checkpoint_store store(dir, 1);
  store.prepare_io(bytes);
  grace::snapshot_buffers buf(refs);
  std::vector<double> serial, overlapped;
  for (uint64_t r = 0; r < 2 * reps; ++r) {
    grace::checkpoint_meta meta;
    meta.step = r + 1;
    meta.kind = grace::checkpoint_kind::manual;
    const bool overlap = r % 2;
    auto t0 = clk::now();
    grace::result<grace::save_stats> saved = grace::error{grace::errc::failed, "not run"};
    if (overlap) {
      buf.begin_capture();
      std::thread writer([&] {
        saved = store.save(buf.view(), meta, [&](uint64_t n) { return buf.wait_captured(n); });
      });
      auto st = buf.copy_in(refs);
      writer.join();
      if (!st) die("syncsave: capture failed: " + st.err().message);
    } else {
      if (auto st = buf.capture(refs); !st) die("syncsave: capture failed: " + st.err().message);
      saved = store.save(buf.view(), meta);
    }
    auto t1 = clk::now();
    if (!saved) die("syncsave: save failed: " + saved.err().message);
    (overlap ? overlapped : serial).push_back(secs(t0, t1));
  }
  std::printf("{\"row\":\"syncsave\",\"bytes\":%llu,\"serial_ms\":%.3f,\"overlapped_ms\":%.3f}\n",
              (unsigned long long)bytes, median(serial) * 1e3, median(overlapped) * 1e3);
  std::filesystem::remove_all(dir, ec);
  return 0;
}

// ------------------------------------------------------------------ allreduce

int mode_allreduce(const std::map<std::string, std::string>& a) {
  const int rank = static_cast<int>(get_u(a, "rank", 0));
  const int size = static_cast<int>(get_u(a, "size", 2));
  const uint64_t reps = get_u(a, "reps", 10);
  const std::string store_dir = get_s(a, "store", "/tmp/grace-bench-store");
  std::vector<size_t> sizes;
  std::string s = get_s(a, "floats", "1048576");
  for (size_t pos = 0; pos <= s.size();) {
    size_t c = s.find(',', pos);
    if (c == std::string::npos) c = s.size();
    sizes.push_back(std::strtoull(s.substr(pos, c - pos).c_str(), nullptr, 10));
    pos = c + 1;
  }
  auto store = std::make_shared<gloo::rendezvous::FileStore>(store_dir);
  auto c = grace::gloo_comm::connect(store, "bench", rank, size, std::chrono::seconds(60), "127.0.0.1");
  if (!c) die("allreduce: connect failed: " + c.err().message);
  auto& comm = *c.value();
  for (size_t n : sizes) {
    std::vector<float> v(n, 1.0f);
    std::vector<double> t;
    for (uint64_t r = 0; r < reps + 2; ++r) {
      if (auto st = comm.barrier(); !st) die("allreduce: barrier failed");
      auto t0 = clk::now();
      if (auto st = comm.allreduce_sum(v.data(), n); !st) die("allreduce failed: " + st.err().message);
      auto t1 = clk::now();
      if (r >= 2) t.push_back(secs(t0, t1));
    }
    if (rank == 0)
      std::printf("{\"row\":\"allreduce\",\"impl\":\"grace\",\"floats\":%zu,\"median_ms\":%.3f}\n", n, median(t) * 1e3);
  }
  return 0;
}

// ------------------------------------------------------- sharded save (parts)

/// The restore of what mode_parts saved: every rank (a thread with its own
/// store) restores its slice at once through its staging (O_DIRECT: no page
/// cache between the save and this). One row: the aggregate bandwidth.
void parts_restore(std::vector<std::unique_ptr<grace::checkpoint_store>>& stores,
                   const std::vector<std::vector<grace::snapshot_tensor>>& snaps, size_t n, uint64_t bytes) {
  const auto ranks = static_cast<uint32_t>(stores.size());
  // The tensors and the staging a session restores through (its snapshot
  // buffers), both faulted in before timing, as in a session.
  std::unique_ptr<float[]> out(new float[n]), staging(new float[n]);
  std::memset(out.get(), 0, n * sizeof(float));
  std::memset(staging.get(), 0, n * sizeof(float));
  std::atomic<int> failed{0};
  auto t0 = clk::now();
  std::vector<std::thread> rs;
  for (uint32_t r = 0; r < ranks; ++r)
    rs.emplace_back([&, r] {
      auto& t = snaps[r][0];
      const int64_t at = t.offsets.empty() ? 0 : t.offsets[0];
      grace::tensor_ref ref{"state", grace::dtype::f32, t.shape, out.get() + at};
      if (ranks > 1) ref.global_shape = t.global_shape, ref.offsets = t.offsets;
      auto got = stores[r]->restore_latest({ref}, {staging.get() + at});
      if (!got || !got->found) failed = 1;
    });
  for (auto& t : rs) t.join();
  const double s = secs(t0, clk::now());
  if (failed) die("parts: a restore failed");
  std::printf("{\"row\":\"parts_restore\",\"ranks\":%u,\"bytes\":%llu,\"s\":%.4f,\"gbps\":%.4f}\n", ranks,
              (unsigned long long)bytes, s, bytes / s / 1e9);
}

/// Aggregate bandwidth of a sharded save: `ranks` writers (threads, each
/// with its own store as each rank process has) write their part of `bytes`
/// in parallel, then one commits; against one writer saving all of it.
/// --ranks 1: the single writer (checkpoint_store::save) instead.
/// --restore 1: then every rank restores its slice (row parts_restore).
int mode_parts(const std::map<std::string, std::string>& a) {
  const uint64_t bytes = get_u(a, "bytes", 256ull << 20);
  const uint32_t ranks = static_cast<uint32_t>(get_u(a, "ranks", 2));
  const std::filesystem::path dir = get_s(a, "dir", "/tmp/grace-bench-parts");
  const size_t n = bytes / sizeof(float);
  std::unique_ptr<float[]> data(new float[n]);
  for (size_t j = 0; j < n; ++j) data[j] = static_cast<float>(j % 1021) * 0.5f;
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  grace::checkpoint_meta meta;
  meta.step = 1;
  meta.world_size = static_cast<int>(ranks);
  meta.kind = grace::checkpoint_kind::manual;
  std::vector<std::unique_ptr<grace::checkpoint_store>> stores;
  std::vector<std::vector<grace::snapshot_tensor>> snaps(ranks);
  for (uint32_t r = 0; r < ranks; ++r) {
    auto [b, c] = grace::even_split(static_cast<int64_t>(n), r, ranks);
    grace::snapshot_tensor t{"state", grace::dtype::f32, {c}, data.get() + b, static_cast<size_t>(c) * sizeof(float)};
    if (ranks > 1) t.global_shape = {static_cast<int64_t>(n)}, t.offsets = {b};
    snaps[r].push_back(t);
    stores.push_back(std::make_unique<grace::checkpoint_store>(dir, 1));
    stores.back()->prepare_io(t.bytes);
  }
  auto t0 = clk::now();
  if (ranks == 1) {
    if (auto r = stores[0]->save(snaps[0], meta); !r) die("parts: save failed: " + r.err().message);
  } else {
    std::vector<std::thread> ws;
    std::atomic<int> failed{0};
    for (uint32_t r = 0; r < ranks; ++r)
      ws.emplace_back([&, r] {
        if (!stores[r]->save_part(snaps[r], meta, "bench", r, r == 0)) failed = 1;
      });
    for (auto& w : ws) w.join();
    if (failed) die("parts: a part failed");
    if (auto c = stores[0]->commit_parts(meta, "bench"); !c) die("parts: commit failed: " + c.err().message);
  }
  const double s = secs(t0, clk::now());
  std::printf("{\"row\":\"parts\",\"ranks\":%u,\"bytes\":%llu,\"s\":%.4f,\"gbps\":%.4f}\n", ranks,
              (unsigned long long)bytes, s, bytes / s / 1e9);
  if (get_u(a, "restore", 0)) parts_restore(stores, snaps, n, bytes);
  std::filesystem::remove_all(dir, ec);
  return 0;
}

/// One byte there and back on a connection just set up, then closed.
void ping_and_close(int fd) {
  char c = 'x';
  if (!grace::tcp::send_all(fd, &c, 1) || !grace::tcp::recv_all(fd, &c, 1)) die("gate: the echo failed");
  ::close(fd);
}

/// Connection setup through the bulk channel's gate (the challenge-response)
/// against a plain TCP connect to a plain listener, interleaved, each with
/// one echoed byte: the gate's cost per connection.
int mode_gate(const std::map<std::string, std::string>& a) {
  using namespace std::chrono_literals;
  const uint64_t reps = get_u(a, "reps", 2000);
  auto l = grace::tcp::listen_on("127.0.0.1", 64);
  if (!l) die("gate: listen failed");
  const std::string plain_ep = "127.0.0.1:" + std::to_string(l->second);
  std::thread plain([fd = l->first, reps] {
    for (uint64_t i = 0; i < reps; ++i) {
      int c = ::accept(fd, nullptr, nullptr);
      if (c < 0) continue;
      char b;
      if (::recv(c, &b, 1, 0) == 1) (void)::send(c, &b, 1, MSG_NOSIGNAL);
      ::close(c);
    }
  });
  grace::bulk_config c;
  c.kind = grace::bulk_kind::state;
  c.address = "127.0.0.1";
  c.token = "bench-job-secret-0123456789";
  auto server = grace::bulk_server::start(c, [](int fd, int) {
    char b;
    if (::recv(fd, &b, 1, 0) == 1) (void)::send(fd, &b, 1, MSG_NOSIGNAL);
  });
  if (!server) die("gate: " + server.err().message);
  std::vector<double> plain_us, gate_us;
  for (uint64_t i = 0; i < reps; ++i) {
    auto t0 = clk::now();
    auto fd = grace::tcp::connect_to(plain_ep, 2000ms);
    if (!fd) die("gate: plain connect: " + fd.err().message);
    ping_and_close(*fd);
    auto t1 = clk::now();
    auto g = grace::bulk_connect((*server)->endpoint(), c.kind, c.token, 2000ms);
    if (!g) die("gate: " + g.err().message);
    ping_and_close(g->release());
    auto t2 = clk::now();
    plain_us.push_back(secs(t0, t1) * 1e6);
    gate_us.push_back(secs(t1, t2) * 1e6);
  }
  plain.join();
  ::close(l->first);
  const double p = median(plain_us), g = median(gate_us);
  std::printf("{\"row\":\"gate\",\"reps\":%llu,\"plain_us\":%.2f,\"gate_us\":%.2f,\"added_us\":%.2f}\n",
              (unsigned long long)reps, p, g, g - p);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  spdlog::set_level(spdlog::level::warn);
  if (argc < 2) die("usage: grace-bench rtt|agreement|ckpt|snapshot|syncsave|odirect|allreduce|parts|gate [--options]");
  std::string mode = argv[1];
  auto a = parse(argc, argv, 2);
  if (mode == "rtt") return mode_rtt(a);
  if (mode == "agreement") return mode_agreement(a);
  if (mode == "ckpt") return mode_ckpt(a);
  if (mode == "snapshot") return mode_snapshot(a);
  if (mode == "syncsave") return mode_syncsave(a);
  if (mode == "odirect") return mode_odirect(a);
  if (mode == "allreduce") return mode_allreduce(a);
  if (mode == "parts") return mode_parts(a);
  if (mode == "gate") return mode_gate(a);
  die("unknown mode '" + mode + "'");
}
