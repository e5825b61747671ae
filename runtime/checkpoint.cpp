#include "runtime/checkpoint.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <system_error>
#include <thread>
#include <unordered_map>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <xxhash.h>

#include "runtime/device_copy.hpp"
#include "runtime/posix_file.hpp"
#include "runtime/safetensors.hpp"

namespace grace {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* manifest_name = "grace-manifest.json";
constexpr const char* index_name = "model.safetensors.index.json";
constexpr const char* tmp_prefix = ".tmp-step-";
constexpr const char* corrupt_marker = ".corrupt-";
constexpr size_t io_chunk = 64u << 20;      ///< write chunk: large sequential writes
constexpr size_t read_chunk = 8u << 20;     ///< checksum read buffer
constexpr uint64_t max_json_bytes = 256u << 20; ///< manifest / index size limit

/// Temp dirs this process is writing right now. A pid alone cannot tell
/// whether a `.tmp-*` dir is ours: in a container the restarted trainer
/// often gets the same pid as the one that crashed.
std::mutex active_mutex;
std::set<std::string> active_temps;

double now_unix() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, v);
  return buf;
}

error invalid(const fs::path& p, const std::string& what) {
  return error{errc::invalid_input, p.string() + ": " + what};
}

status fsync_dir(const fs::path& d) {
  fd_guard f(::open(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (f.fd < 0) return error{errc::failed, d.string() + ": cannot open directory for fsync: " + errno_str(errno)};
  if (::fsync(f.fd) != 0) return error{errc::failed, d.string() + ": fsync failed: " + errno_str(errno)};
  return {};
}

/// Staging for O_DIRECT writes: two 4096-aligned buffers of `io_chunk`
/// bytes. A pair is kept for the life of the process and reused by later
/// saves: touching fresh pages runs far below memcpy speed (and slower still
/// after idle on a VM that hands memory back to its host), which would eat
/// much of what O_DIRECT gains. A second
/// concurrent save (another store) gets a pair of its own, freed after.
class staging_buffers {
public:
  static constexpr size_t align = 4096;
  static constexpr int count = 2;  ///< two writes in flight while the caller copies and hashes
  static constexpr size_t bytes = io_chunk;
  staging_buffers() {
    {
      std::lock_guard<std::mutex> lk(pool_mutex());
      auto& pool = pool_free();
      if (!pool.empty()) {
        buf_ = std::move(pool.back());
        pool.pop_back();
        return;
      }
    }
    for (auto& b : buf_) {
      void* mem = nullptr;
      if (::posix_memalign(&mem, align, bytes) != 0) throw std::bad_alloc();
      b.reset(static_cast<unsigned char*>(mem));
    }
  }
  ~staging_buffers() {
    std::lock_guard<std::mutex> lk(pool_mutex());
    if (pool_free().empty()) pool_free().push_back(std::move(buf_));
  }
  staging_buffers(const staging_buffers&) = delete;
  staging_buffers& operator=(const staging_buffers&) = delete;
  unsigned char* operator[](int i) const noexcept { return buf_[i].get(); }

  /// Calls f(buffer index, pointer) for the pooled pair while holding the
  /// pool, i.e. while no save or restore uses it; nothing when it is in use
  /// or was never allocated.
  template <class F> static void with_idle_pair(F&& f) {
    std::lock_guard<std::mutex> lk(pool_mutex());
    if (pool_free().empty()) return;
    for (int i = 0; i < count; ++i) f(i, pool_free().back()[i].get());
  }

private:
  struct free_deleter {
    void operator()(unsigned char* p) const noexcept { std::free(p); }
  };
  using pair = std::array<std::unique_ptr<unsigned char, free_deleter>, count>;
  static std::mutex& pool_mutex() {
    static std::mutex m;
    return m;
  }
  static std::vector<pair>& pool_free() {
    static std::vector<pair> v;
    return v;
  }
  pair buf_;
};

/// How far prepare_io_buffers has touched the pooled pair (bytes of buffer 0
/// and 1); only grows.
std::mutex prepared_mutex;
size_t prepared[staging_buffers::count] = {0, 0};

/// One output file: sequential writes with the checksum computed on the fly.
///
/// Direct mode (large shards): the bytes are copied into two aligned
/// staging buffers and written with O_DIRECT at 64 MiB offsets, one thread
/// per write, so up to two writes are in flight while the caller's thread
/// copies and hashes. Through the page cache a save beyond ~256 MiB runs at
/// 0.3-0.4 GB/s here (the kernel must first take memory back from the host
/// and throttles dirty pages); O_DIRECT runs at disk speed. The last block
/// is zero-padded to the alignment and the file truncated back to its true
/// size, so the bytes, and therefore the checksums, are exactly those of a
/// buffered write. Filesystems without O_DIRECT (open fails with EINVAL)
/// and writes the kernel refuses as unaligned (EINVAL) fall back to
/// buffered I/O.
class hashed_file {
public:
  hashed_file() : state_(XXH3_createState()) {
    if (!state_) throw std::bad_alloc();
    XXH3_64bits_reset(state_);
  }
  ~hashed_file() {
    for (auto& p : pending_)
      if (p.valid()) p.wait(); // before the buffers and the fd go away
    XXH3_freeState(state_);
  }
  hashed_file(const hashed_file&) = delete;
  hashed_file& operator=(const hashed_file&) = delete;

  /// `direct`: try O_DIRECT first.
  status open(const fs::path& p, uint64_t expected_size, bool direct = false) {
    path_ = p;
    constexpr int flags = O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC;
    if (direct) {
      f_.fd = ::open(p.c_str(), flags | O_DIRECT, 0644);
      if (f_.fd >= 0) {
        staging_ = std::make_unique<staging_buffers>();
      } else if (errno == EINVAL) {
        // No O_DIRECT here. The failed open may already have created the
        // file (the flag is checked after the lookup): it is ours, in our
        // private temp dir.
        ::unlink(p.c_str());
      } else {
        return fail("cannot create", errno);
      }
    }
    if (f_.fd < 0) f_.fd = ::open(p.c_str(), flags, 0644);
    if (f_.fd < 0) return fail("cannot create", errno);
    if (expected_size > 0) {
      // Reserve the space up front: a full disk is reported before we
      // spend time writing, and the file is laid out contiguously.
      // fallocate(2), not posix_fallocate: glibc emulates the latter by
      // writing every block where the filesystem lacks support.
      if (::fallocate(f_.fd, 0, 0, static_cast<off_t>(expected_size)) != 0 &&
          (errno == ENOSPC || errno == EIO || errno == EDQUOT))
        return fail("cannot reserve space", errno);
    }
    return {};
  }

  /// Whether writes go through O_DIRECT staging (for tests and logs).
  bool direct() const noexcept { return staging_ != nullptr; }

  status write(const void* data, size_t n) {
    if (staging_) return write_direct(static_cast<const unsigned char*>(data), n);
    auto* p = static_cast<const char*>(data);
    while (n > 0) {
      size_t chunk = std::min(n, io_chunk);
      size_t done = 0;
      while (done < chunk) {
        ssize_t r = ::write(f_.fd, p + done, chunk - done);
        if (r < 0) {
          if (errno == EINTR) continue;
          return fail("write failed", errno);
        }
        if (r == 0) return fail("write failed", ENOSPC);
        done += static_cast<size_t>(r);
      }
      XXH3_64bits_update(state_, p, chunk);
      size_ += chunk;
      p += chunk;
      n -= chunk;
    }
    return {};
  }

  /// Completes outstanding writes (direct mode: the padded last block, then
  /// truncation to the true size). Part of the write time, not the fsync.
  status flush() {
    if (!staging_) return {};
    if (fill_ > 0) submit();
    for (int i = 0; i < staging_buffers::count; ++i)
      if (auto st = wait(i); !st) return st;
    if (::ftruncate(f_.fd, static_cast<off_t>(size_)) != 0) return fail("truncate failed", errno);
    // Every write is done: the staging pair goes back to the pool for the
    // next file while this one is still being fsynced.
    staging_.reset();
    return {};
  }

  /// fsync and close; adds the time spent to `fsync_seconds`.
  status finish(double& fsync_seconds) {
    if (auto st = flush(); !st) return st;
    auto t0 = std::chrono::steady_clock::now();
    if (::fsync(f_.fd) != 0) return fail("fsync failed", errno);
    fsync_seconds += seconds_since(t0);
    int fd = f_.fd;
    f_.fd = -1;
    if (::close(fd) != 0) return fail("close failed", errno);
    return {};
  }

  checkpoint_file entry() const {
    return {path_.filename().string(), size_, hex64(XXH3_64bits_digest(state_))};
  }

private:
  status write_direct(const unsigned char* p, size_t n) {
    while (n > 0) {
      if (fill_ == 0)
        if (auto st = wait(cur_); !st) return st; // the buffer's previous write
      size_t k = std::min(n, staging_buffers::bytes - fill_);
      std::memcpy((*staging_)[cur_] + fill_, p, k);
      fill_ += k;
      p += k;
      n -= k;
      if (fill_ == staging_buffers::bytes) submit();
    }
    return {};
  }

  /// Starts writing the current buffer at the file's end, then hashes it
  /// while the write (and possibly the other buffer's) is in flight.
  void submit() {
    unsigned char* buf = (*staging_)[cur_];
    const size_t len = fill_;
    const size_t padded = (len + staging_buffers::align - 1) & ~(staging_buffers::align - 1);
    std::memset(buf + len, 0, padded - len);
    const off_t off = static_cast<off_t>(size_);
    const int fd = f_.fd;
    pending_[cur_] = std::async(std::launch::async, [fd, buf, padded, off] { return pwrite_all(fd, buf, padded, off); });
    XXH3_64bits_update(state_, buf, len);
    size_ += len;
    fill_ = 0;
    cur_ = (cur_ + 1) % staging_buffers::count;
  }

  status wait(int i) {
    if (!pending_[i].valid()) return {};
    int e = pending_[i].get();
    if (e != 0) return fail("write failed", e);
    return {};
  }

  /// Returns 0 or an errno. An unaligned-I/O refusal (EINVAL) switches the
  /// descriptor to buffered writes and retries.
  static int pwrite_all(int fd, const unsigned char* buf, size_t n, off_t off) {
    size_t done = 0;
    while (done < n) {
      ssize_t r = ::pwrite(fd, buf + done, n - done, off + static_cast<off_t>(done));
      if (r < 0) {
        const int e = errno;
        if (e == EINTR) continue;
        const int fl = e == EINVAL ? ::fcntl(fd, F_GETFL) : -1;
        if (fl >= 0 && (fl & O_DIRECT)) {
          if (::fcntl(fd, F_SETFL, fl & ~O_DIRECT) == 0) continue;
          return EINVAL;
        }
        return e;
      }
      if (r == 0) return ENOSPC;
      done += static_cast<size_t>(r);
    }
    return 0;
  }

  error fail(const char* what, int e) {
    return error{errc::failed, path_.string() + ": " + what + ": " + errno_str(e)};
  }
  fs::path path_;
  fd_guard f_;
  XXH3_state_t* state_;
  uint64_t size_ = 0; ///< bytes accepted (and hashed) so far, without padding
  std::unique_ptr<staging_buffers> staging_; ///< set in direct mode
  size_t fill_ = 0;   ///< bytes in the current staging buffer
  int cur_ = 0;       ///< the staging buffer being filled
  std::future<int> pending_[staging_buffers::count]; ///< each buffer's write in flight (errno or 0)
};

/// Receives a file's bytes in order: (file offset, bytes, count).
using chunk_sink = std::function<void(uint64_t, const unsigned char*, size_t)>;

/// Files at least this big are read with O_DIRECT, smaller ones buffered.
constexpr uint64_t direct_read_min = 8u << 20;

/// `pread` until `n` bytes or the end of the file: the count, or -errno. An
/// O_DIRECT refusal (EINVAL) switches the descriptor to buffered reads.
ssize_t pread_full(int fd, unsigned char* buf, size_t n, off_t off) {
  size_t done = 0;
  while (done < n) {
    ssize_t r = ::pread(fd, buf + done, n - done, off + static_cast<off_t>(done));
    if (r < 0) {
      const int e = errno;
      if (e == EINTR) continue;
      const int fl = e == EINVAL ? ::fcntl(fd, F_GETFL) : -1;
      if (fl >= 0 && (fl & O_DIRECT) && ::fcntl(fd, F_SETFL, fl & ~O_DIRECT) == 0) continue;
      return -e;
    }
    if (r == 0) break;
    done += static_cast<size_t>(r);
  }
  return static_cast<ssize_t>(done);
}

/// Reads a whole file front to back once, hashing it with xxh3 and handing
/// every piece to `sink` (may be empty); returns the hash.
///
/// The file must be `expected_size` bytes (the manifest's). Large files are
/// read with O_DIRECT into the pooled staging buffers, each 64 MiB chunk as
/// two concurrent 32 MiB reads, the next chunk in flight while this one is
/// hashed and handed on: no page-cache pages to allocate (slow on VMs that
/// hand idle memory back to the host, as for writes) and two requests queued at the disk, where a buffered
/// read leaves it to readahead. Small files, and filesystems without
/// O_DIRECT, are read buffered.
result<uint64_t> stream_file(const fs::path& p, uint64_t expected_size, const chunk_sink& sink) {
  fd_guard f;
  bool direct = false;
  if (expected_size >= direct_read_min) {
    f.fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
    direct = f.fd >= 0;
  }
  if (f.fd < 0) f.fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd < 0) return invalid(p, errno == ENOENT ? "missing" : "cannot open: " + errno_str(errno));
  struct stat sb {};
  if (::fstat(f.fd, &sb) != 0) return invalid(p, "cannot stat: " + errno_str(errno));
  if (!S_ISREG(sb.st_mode)) return invalid(p, "not a regular file");
  const auto size = static_cast<uint64_t>(sb.st_size);
  if (size != expected_size)
    return invalid(p, "size " + std::to_string(size) + " but the manifest says " + std::to_string(expected_size) +
                          " (truncated or partially written)");
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> st(XXH3_createState(), &XXH3_freeState);
  if (!st) throw std::bad_alloc();
  XXH3_64bits_reset(st.get());
  auto short_read = [&](ssize_t r) {
    return invalid(p, r < 0 ? "read failed: " + errno_str(static_cast<int>(-r))
                            : std::string("shorter than its size while reading (changed underneath?)"));
  };

  if (!direct) {
    std::unique_ptr<unsigned char[]> buf(new unsigned char[static_cast<size_t>(std::min<uint64_t>(size, read_chunk)) + 1]);
    for (uint64_t off = 0; off < size;) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(read_chunk, size - off));
      const ssize_t r = pread_full(f.fd, buf.get(), n, static_cast<off_t>(off));
      if (r != static_cast<ssize_t>(n)) return short_read(r);
      XXH3_64bits_update(st.get(), buf.get(), n);
      if (sink) sink(off, buf.get(), n);
      off += n;
    }
    return XXH3_64bits_digest(st.get());
  }

  // Direct: chunk i lives in staging buffer i % 2. The futures are declared
  // after the buffers so they are waited for before the buffers go back to
  // the pool, on every path out.
  staging_buffers bufs;
  constexpr size_t chunk = staging_buffers::bytes, half = chunk / 2, align = staging_buffers::align;
  const uint64_t chunks = (size + chunk - 1) / chunk;
  struct piece {
    std::future<ssize_t> read;
    size_t want = 0;
  };
  std::array<std::array<piece, 2>, staging_buffers::count> inflight;
  const int fd = f.fd;
  auto issue = [&](uint64_t i) {
    unsigned char* buf = bufs[static_cast<int>(i % staging_buffers::count)];
    auto& slot = inflight[i % staging_buffers::count];
    const uint64_t off = i * chunk;
    const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk, size - off));
    for (size_t h = 0; h < 2; ++h) {
      const size_t begin = h * half;
      slot[h].want = begin < n ? std::min(half, n - begin) : 0;
      if (slot[h].want == 0) continue;
      // Ask for whole blocks: at the end of the file the read stops short.
      const size_t ask = (slot[h].want + align - 1) & ~(align - 1);
      const off_t at = static_cast<off_t>(off + begin);
      slot[h].read = std::async(std::launch::async, [fd, buf, begin, ask, at] {
        return pread_full(fd, buf + begin, ask, at);
      });
    }
  };
  issue(0);
  if (chunks > 1) issue(1);
  for (uint64_t i = 0; i < chunks; ++i) {
    auto& slot = inflight[i % staging_buffers::count];
    for (auto& pc : slot) {
      if (pc.want == 0) continue;
      const ssize_t r = pc.read.get();
      if (r != static_cast<ssize_t>(pc.want)) return short_read(r);
    }
    const unsigned char* buf = bufs[static_cast<int>(i % staging_buffers::count)];
    const uint64_t off = i * chunk;
    const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk, size - off));
    XXH3_64bits_update(st.get(), buf, n);
    if (sink) sink(off, buf, n);
    if (i + staging_buffers::count < chunks) issue(i + staging_buffers::count);
  }
  return XXH3_64bits_digest(st.get());
}

/// Checks one listed file's size and checksum, handing its bytes to `sink`.
/// `compare`: false only for the broken-on-purpose restore mutant.
status check_file(const fs::path& step_dir, const checkpoint_file& f, const chunk_sink& sink = {},
                  bool compare = true) {
  const auto p = step_dir / f.name;
  auto h = stream_file(p, f.size, sink);
  if (!h) return h.err();
  if (compare && hex64(*h) != f.xxh3)
    return invalid(p, "checksum mismatch: xxh3 " + hex64(*h) + ", manifest says " + f.xxh3 + " (file corrupted)");
  return {};
}

bool is_shard(const std::string& name) {
  const std::string suffix = ".safetensors";
  return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

/// Copies `n` bytes, on two threads when it is large (restores end with one
/// copy of the whole state; one core does not saturate memory here).
void copy_large(void* dst, const void* src, size_t n) {
  constexpr size_t parallel_min = 32u << 20;
  if (n < parallel_min || std::thread::hardware_concurrency() < 2) {
    std::memcpy(dst, src, n);
    return;
  }
  const size_t first = (n / 2) & ~size_t(4095);
  std::thread t([=] { std::memcpy(dst, src, first); });
  std::memcpy(static_cast<char*>(dst) + first, static_cast<const char*>(src) + first, n - first);
  t.join();
}

/// Reads a small JSON file defensively (size-limited, no exceptions).
result<json> read_json(const fs::path& p) {
  fd_guard f(::open(p.c_str(), O_RDONLY | O_CLOEXEC));
  if (f.fd < 0) {
    if (errno == ENOENT) return invalid(p, "missing");
    return invalid(p, "cannot open: " + errno_str(errno));
  }
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) return invalid(p, "cannot stat: " + errno_str(errno));
  if (!S_ISREG(st.st_mode)) return invalid(p, "not a regular file");
  if (static_cast<uint64_t>(st.st_size) > max_json_bytes) return invalid(p, "implausibly large (" + std::to_string(st.st_size) + " bytes)");
  std::string text(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < text.size()) {
    ssize_t r = ::read(f.fd, text.data() + got, text.size() - got);
    if (r < 0) {
      if (errno == EINTR) continue;
      return invalid(p, "read failed: " + errno_str(errno));
    }
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  text.resize(got);
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded()) return invalid(p, "not valid JSON");
  return j;
}

/// Writes a small in-memory file into the temp dir with checksum and fsync.
result<checkpoint_file> write_small(const fs::path& p, const std::string& text, save_stats& stats) {
  hashed_file f;
  auto t0 = std::chrono::steady_clock::now();
  if (auto s = f.open(p, text.size()); !s) return s.err();
  if (auto s = f.write(text.data(), text.size()); !s) return s.err();
  stats.write_seconds += seconds_since(t0);
  if (auto s = f.finish(stats.fsync_seconds); !s) return s.err();
  return f.entry();
}

json manifest_to_json(const checkpoint_manifest& m) {
  json files = json::array();
  for (auto& f : m.files) files.push_back({{"name", f.name}, {"size", f.size}, {"xxh3", f.xxh3}});
  std::time_t t = static_cast<std::time_t>(m.wall_time);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char iso[32];
  std::strftime(iso, sizeof iso, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return json{{"format", "grace-checkpoint"},
              {"format_version", m.format_version},
              {"step", m.step},
              {"world_size", m.world_size},
              {"run_id", m.run_id},
              {"incarnation", m.incarnation},
              {"kind", to_string(m.kind)},
              {"wall_time", m.wall_time},
              {"wall_time_utc", iso},
              {"counters", m.counters},
              {"metadata", m.metadata},
              {"files", files}};
}

bool safe_file_name(const std::string& n) {
  return !n.empty() && n != "." && n != ".." && n.find('/') == std::string::npos &&
         n.find('\0') == std::string::npos;
}

result<checkpoint_manifest> manifest_from_json(const fs::path& p, const json& j) {
  if (!j.is_object()) return invalid(p, "manifest is not a JSON object");
  checkpoint_manifest m;
  try {
    auto need = [&](const char* k) -> const json* {
      auto it = j.find(k);
      return it == j.end() ? nullptr : &*it;
    };
    const json* v = need("format_version");
    if (!v || !v->is_number_integer()) return invalid(p, "manifest has no format_version");
    m.format_version = v->get<int>();
    if (m.format_version < 1 || m.format_version > checkpoint_manifest::current_format_version)
      return invalid(p, "unsupported manifest format_version " + std::to_string(m.format_version) +
                            " (this build reads up to " +
                            std::to_string(checkpoint_manifest::current_format_version) + ")");
    if (!(v = need("step")) || !v->is_number_unsigned()) return invalid(p, "manifest has no step");
    m.step = v->get<uint64_t>();
    if ((v = need("world_size")) && v->is_number_integer()) m.world_size = v->get<int>();
    if ((v = need("run_id")) && v->is_string()) m.run_id = v->get<std::string>();
    if ((v = need("incarnation")) && v->is_number_unsigned()) m.incarnation = v->get<uint64_t>();
    if (!(v = need("kind")) || !v->is_string() || !parse_checkpoint_kind(v->get<std::string>(), m.kind))
      return invalid(p, "manifest has no valid kind");
    if ((v = need("wall_time")) && v->is_number()) m.wall_time = v->get<double>();
    if ((v = need("counters"))) {
      if (!v->is_object()) return invalid(p, "manifest counters is not an object");
      for (auto& [k, c] : v->items()) {
        if (!c.is_number_integer()) return invalid(p, "manifest counter '" + k + "' is not an integer");
        m.counters[k] = c.get<int64_t>();
      }
    }
    if ((v = need("metadata"))) {
      if (!v->is_object()) return invalid(p, "manifest metadata is not an object");
      for (auto& [k, c] : v->items()) {
        if (!c.is_string()) return invalid(p, "manifest metadata '" + k + "' is not a string");
        m.metadata[k] = c.get<std::string>();
      }
    }
    if (!(v = need("files")) || !v->is_array()) return invalid(p, "manifest has no files list");
    for (auto& f : *v) {
      if (!f.is_object() || !f.contains("name") || !f["name"].is_string() || !f.contains("size") ||
          !f["size"].is_number_unsigned() || !f.contains("xxh3") || !f["xxh3"].is_string())
        return invalid(p, "manifest has a malformed files entry");
      checkpoint_file cf{f["name"].get<std::string>(), f["size"].get<uint64_t>(), f["xxh3"].get<std::string>()};
      if (!safe_file_name(cf.name)) return invalid(p, "manifest names an unsafe file '" + cf.name + "'");
      m.files.push_back(std::move(cf));
    }
  } catch (const json::exception& e) {
    return invalid(p, std::string("malformed manifest: ") + e.what());
  }
  return m;
}

/// "step-0000000120" -> 120. Only all-digit suffixes.
bool parse_step_name(const std::string& name, uint64_t& step) {
  if (name.rfind("step-", 0) != 0 || name.size() <= 5 || name.size() > 5 + 20) return false;
  uint64_t v = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    char c = name[i];
    if (c < '0' || c > '9') return false;
    uint64_t d = static_cast<uint64_t>(c - '0');
    if (v > (UINT64_MAX - d) / 10) return false;
    v = v * 10 + d;
  }
  step = v;
  return true;
}

/// ".tmp-step-<N>-<pid>-<rand>" -> step, pid.
bool parse_tmp_name(const std::string& name, uint64_t& step, long& pid) {
  if (name.rfind(tmp_prefix, 0) != 0) return false;
  unsigned long long s = 0;
  long p = 0;
  char rnd[64];
  if (std::sscanf(name.c_str() + std::strlen(tmp_prefix), "%llu-%ld-%63s", &s, &p, rnd) != 3) return false;
  step = s;
  pid = p;
  return true;
}

bool pid_alive(long pid) {
  if (pid <= 0) return false;
  if (::kill(static_cast<pid_t>(pid), 0) == 0) return true;
  return errno == EPERM;
}

bool is_active_temp(const fs::path& p) {
  std::lock_guard<std::mutex> lk(active_mutex);
  return active_temps.count(p.filename().string()) > 0;
}

/// Manifest present and parsable; every listed file present with its size.
result<checkpoint_manifest> quick_check(const checkpoint_store& store, const fs::path& d) {
  auto m = store.read_manifest(d);
  if (!m) return m.err();
  for (auto& f : m->files) {
    std::error_code ec;
    auto p = d / f.name;
    auto st = fs::status(p, ec);
    if (ec || !fs::is_regular_file(st)) return invalid(p, "missing");
    auto sz = fs::file_size(p, ec);
    if (ec) return invalid(p, "cannot stat: " + ec.message());
    if (sz != f.size)
      return invalid(p, "size " + std::to_string(sz) + " but the manifest says " + std::to_string(f.size) +
                            " (truncated or partially written)");
  }
  return m;
}

} // namespace

const char* to_string(checkpoint_kind k) noexcept {
  switch (k) {
    case checkpoint_kind::preempt: return "preempt";
    case checkpoint_kind::periodic: return "periodic";
    case checkpoint_kind::final: return "final";
    case checkpoint_kind::jit: return "jit";
    case checkpoint_kind::manual: return "manual";
  }
  return "unknown";
}

bool parse_checkpoint_kind(const std::string& s, checkpoint_kind& out) noexcept {
  for (auto k : {checkpoint_kind::preempt, checkpoint_kind::periodic, checkpoint_kind::final,
                 checkpoint_kind::jit, checkpoint_kind::manual})
    if (s == to_string(k)) { out = k; return true; }
  return false;
}

checkpoint_store::checkpoint_store(fs::path dir, int keep_last)
    : dir_(std::move(dir)), keep_last_(keep_last) {}

fs::path checkpoint_store::step_path(uint64_t step) const {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%010" PRIu64, step);
  return dir_ / buf;
}

void checkpoint_store::prepare_io_buffers(uint64_t state_bytes) {
  // Files below the O_DIRECT thresholds never use the pair.
  if (state_bytes < direct_read_min) return;
  std::lock_guard<std::mutex> lk(prepared_mutex);
  staging_buffers bufs;
  // Chunk i of a file lands in buffer i % 2: a state of B bytes uses up to
  // min(B, 64 MiB) of the first buffer and min(B - 64 MiB, 64 MiB) of the
  // second (plus a header and alignment: round up to whole pages).
  const uint64_t want = state_bytes + staging_buffers::align;
  for (int i = 0; i < staging_buffers::count; ++i) {
    const uint64_t start = uint64_t(i) * staging_buffers::bytes;
    if (want <= start) break;
    const size_t n = static_cast<size_t>(std::min<uint64_t>(want - start, staging_buffers::bytes));
    if (n <= prepared[i]) continue;
    std::memset(bufs[i] + prepared[i], 0, n - prepared[i]);
    prepared[i] = n;
  }
}

void checkpoint_store::keep_io_buffers_warm() {
  std::lock_guard<std::mutex> lk(prepared_mutex);
  staging_buffers::with_idle_pair([](int i, const unsigned char* b) {
    unsigned sink = 0;
    const volatile unsigned char* p = b;
    for (size_t off = 0; off < prepared[i]; off += staging_buffers::align) sink += p[off];
    (void)sink;
  });
}

result<save_stats> checkpoint_store::save(const std::vector<snapshot_tensor>& tensors,
                                          const checkpoint_meta& meta) {
  // Validate and lay out before touching the disk.
  std::vector<safetensors::tensor_desc> descs;
  descs.reserve(tensors.size());
  std::set<std::string> names;
  for (auto& t : tensors) {
    if (t.bytes > 0 && !t.data)
      return error{errc::invalid_input, "tensor '" + t.name + "' has no data"};
    if (!names.insert(t.name).second)
      return error{errc::invalid_input, "duplicate tensor name '" + t.name + "'"};
    descs.push_back({t.name, t.type, t.shape, t.bytes});
  }
  // Shards: whole tensors, in order, at most shard_bytes_ each (a larger
  // tensor gets a shard of its own).
  std::vector<std::vector<size_t>> shards;
  uint64_t cur = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (shards.empty() || (!shards.back().empty() && cur + tensors[i].bytes > shard_bytes_)) {
      shards.emplace_back();
      cur = 0;
    }
    shards.back().push_back(i);
    cur += tensors[i].bytes;
  }
  if (shards.empty()) shards.emplace_back(); // an empty checkpoint still has one (empty) shard
  std::vector<safetensors::encoded_header> headers;
  std::vector<std::string> shard_names;
  for (size_t s = 0; s < shards.size(); ++s) {
    std::vector<safetensors::tensor_desc> sd;
    for (auto i : shards[s]) sd.push_back(descs[i]);
    auto enc = safetensors::encode_header(sd, {{"format", "pt"}});
    if (!enc) return enc.err();
    headers.push_back(std::move(*enc));
    char buf[64];
    std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
    shard_names.emplace_back(buf);
  }

  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) return error{errc::failed, dir_.string() + ": cannot create checkpoint directory: " + ec.message()};
  remove_stale_temporaries();

  std::random_device rd;
  const std::string tmp_name = tmp_prefix + std::to_string(meta.step) + "-" + std::to_string(::getpid()) +
                               "-" + hex64((uint64_t(rd()) << 32) ^ rd()).substr(8);
  const fs::path tmp = dir_ / tmp_name;
  {
    std::lock_guard<std::mutex> lk(active_mutex);
    active_temps.insert(tmp_name);
  }
  struct temp_guard {
    fs::path p;
    std::string name;
    bool keep = false;
    ~temp_guard() {
      if (!keep) {
        std::error_code e;
        fs::remove_all(p, e);
      }
      std::lock_guard<std::mutex> lk(active_mutex);
      active_temps.erase(name);
    }
  } guard{tmp, tmp_name};
  if (::mkdir(tmp.c_str(), 0755) != 0)
    return error{errc::failed, tmp.string() + ": cannot create: " + errno_str(errno)};

  save_stats stats;
  stats.step = meta.step;
  auto fail = [&](const error& e) {
    spdlog::error("checkpoint step {}: save failed: {}", meta.step, e.message);
    return error{errc::failed, e.message};
  };

  // Shards, streamed straight from the caller's buffers. Each shard is
  // fsynced only after the last one is written (all before the manifest):
  // the first fsync commits the journal and makes the host flush the
  // virtual disk's cache for every shard at once, the others find little
  // left to do. An fsync after each shard makes the disk flush at every
  // shard boundary, and writes slow down while it flushes (measurements:
  // docs/BENCHMARKS.md). At most
  // `max_unsynced` files wait open, so tiny shards cannot exhaust fds.
  constexpr size_t max_unsynced = 64;
  uint64_t tensor_total = 0;
  json weight_map = json::object();
  std::deque<hashed_file> unsynced;
  auto sync_oldest = [&]() -> status {
    auto st = unsynced.front().finish(stats.fsync_seconds);
    unsynced.pop_front();
    return st;
  };
  for (size_t s = 0; s < shards.size(); ++s) {
    auto& f = unsynced.emplace_back();
    auto t0 = std::chrono::steady_clock::now();
    if (auto st = f.open(tmp / shard_names[s], headers[s].file_size, direct_io_); !st) return fail(st.err());
    if (auto st = f.write(headers[s].bytes.data(), headers[s].bytes.size()); !st) return fail(st.err());
    for (auto i : shards[s]) {
      if (auto st = f.write(tensors[i].data, tensors[i].bytes); !st) return fail(st.err());
      tensor_total += tensors[i].bytes;
      weight_map[tensors[i].name] = shard_names[s];
    }
    if (auto st = f.flush(); !st) return fail(st.err());
    stats.write_seconds += seconds_since(t0);
    stats.files.push_back(f.entry());
    if (unsynced.size() >= max_unsynced)
      if (auto st = sync_oldest(); !st) return fail(st.err());
  }
  while (!unsynced.empty())
    if (auto st = sync_oldest(); !st) return fail(st.err());

  json index = {{"metadata", {{"total_size", tensor_total}}}, {"weight_map", weight_map}};
  auto idx = write_small(tmp / index_name, index.dump(2) + "\n", stats);
  if (!idx) return fail(idx.err());
  stats.files.push_back(*idx);

  checkpoint_manifest m;
  m.step = meta.step;
  m.world_size = meta.world_size;
  m.run_id = meta.run_id;
  m.incarnation = meta.incarnation;
  m.kind = meta.kind;
  m.wall_time = now_unix();
  m.counters = meta.counters;
  m.metadata = meta.metadata;
  m.files = stats.files;
  // The manifest goes last: its presence means every file before it is complete.
  auto man = write_small(tmp / manifest_name, manifest_to_json(m).dump(2) + "\n", stats);
  if (!man) return fail(man.err());
  {
    auto t0 = std::chrono::steady_clock::now();
    if (auto st = fsync_dir(tmp); !st) return fail(st.err());
    stats.fsync_seconds += seconds_since(t0);
  }
  for (auto& f : stats.files) stats.total_bytes += f.size;
  stats.total_bytes += man->size;

  const fs::path final_path = step_path(meta.step);
  if (fs::exists(fs::symlink_status(final_path, ec))) {
    if (auto v = verify(final_path); v) {
      spdlog::info("checkpoint step {}: {} already exists and verifies; discarding the new copy",
                   meta.step, final_path.string());
      auto existing = read_manifest(final_path);
      stats.path = final_path;
      stats.already_existed = true;
      if (existing) {
        stats.files = existing->files;
        stats.total_bytes = existing->total_bytes();
      }
      return stats;
    } else {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(std::time(nullptr)));
      fs::path aside = final_path;
      aside += std::string(corrupt_marker) + buf;
      spdlog::warn("checkpoint step {}: existing {} is invalid ({}); moving it aside to {}", meta.step,
                   final_path.string(), v.err().message, aside.string());
      if (::rename(final_path.c_str(), aside.c_str()) != 0)
        return fail(error{errc::failed, final_path.string() + ": cannot move invalid checkpoint aside: " +
                                            errno_str(errno)});
    }
  }
  if (::rename(tmp.c_str(), final_path.c_str()) != 0)
    return fail(error{errc::failed, tmp.string() + ": cannot rename to " + final_path.string() + ": " +
                                        errno_str(errno)});
  guard.keep = true;
  {
    auto t0 = std::chrono::steady_clock::now();
    auto st = fsync_dir(dir_);
    stats.fsync_seconds += seconds_since(t0);
    if (!st) return fail(st.err());
  }
  stats.path = final_path;
  spdlog::info("checkpoint step {} committed: {} ({} files, {} bytes, write {:.3f}s, fsync {:.3f}s)",
               meta.step, final_path.string(), stats.files.size() + 1, stats.total_bytes,
               stats.write_seconds, stats.fsync_seconds);
  prune(meta.step);
  return stats;
}

void checkpoint_store::prune(uint64_t committed_step) {
  if (keep_last_ <= 0) return;
  auto all = list();
  std::vector<const checkpoint_info*> valid;
  for (auto& c : all) {
    if (c.temporary || c.set_aside) continue;
    if (c.valid) {
      valid.push_back(&c);
    } else if (c.step < committed_step) {
      spdlog::warn("checkpoint {}: invalid ({}); leaving it in place for inspection", c.path.string(),
                   c.reason);
    }
  }
  std::sort(valid.begin(), valid.end(),
            [](const checkpoint_info* a, const checkpoint_info* b) { return a->step > b->step; });
  for (size_t i = static_cast<size_t>(keep_last_); i < valid.size(); ++i) {
    if (valid[i]->step >= committed_step) continue;
    std::error_code ec;
    fs::remove_all(valid[i]->path, ec);
    if (ec)
      spdlog::warn("checkpoint {}: cannot remove old checkpoint: {}", valid[i]->path.string(), ec.message());
    else
      spdlog::info("checkpoint {}: removed (keep_last={})", valid[i]->path.string(), keep_last_);
  }
}

result<std::vector<checkpoint_info>> checkpoint_store::try_list() const {
  std::vector<checkpoint_info> out;
  std::error_code ec;
  auto st = fs::status(dir_, ec);
  if (ec && ec != std::errc::no_such_file_or_directory)
    return invalid(dir_, "cannot access checkpoint directory: " + ec.message());
  if (!fs::exists(st)) return out;
  if (!fs::is_directory(st)) return invalid(dir_, "not a directory");
  // opendir/readdir rather than directory_iterator: errno gives the message.
  std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(dir_.c_str()), &::closedir);
  if (!d) return invalid(dir_, "cannot read checkpoint directory: " + errno_str(errno));
  std::vector<std::string> names;
  errno = 0;
  while (auto* e = ::readdir(d.get())) names.emplace_back(e->d_name);
  if (errno) return invalid(dir_, "cannot read checkpoint directory: " + errno_str(errno));

  for (auto& name : names) {
    checkpoint_info info;
    info.path = dir_ / name;
    uint64_t step = 0;
    long pid = 0;
    if (parse_step_name(name, step)) {
      info.step = step;
      auto m = quick_check(*this, info.path);
      if (m) {
        info.valid = true;
        info.kind = to_string(m->kind);
        info.total_bytes = m->total_bytes();
        if (m->step != step) {
          info.valid = false;
          info.reason = "manifest says step " + std::to_string(m->step);
        }
      } else {
        info.reason = m.err().message;
      }
    } else if (name.rfind("step-", 0) == 0 && name.find(corrupt_marker) != std::string::npos) {
      parse_step_name(name.substr(0, name.find(corrupt_marker)), info.step);
      info.set_aside = true;
      info.reason = "set aside as corrupt when a new checkpoint took its name";
    } else if (parse_tmp_name(name, step, pid)) {
      info.step = step;
      info.temporary = true;
      info.reason = std::string("leftover temporary from pid ") + std::to_string(pid) +
                    (pid_alive(pid) ? " (still running or in progress)" : " (process gone)");
    } else {
      continue;
    }
    if (info.total_bytes == 0 && !info.temporary) {
      // Sizes from the directory itself, for the listing.
      for (auto it = fs::directory_iterator(info.path, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
        std::error_code e2;
        auto sz = it->file_size(e2);
        if (!e2) info.total_bytes += sz;
      }
    }
    out.push_back(std::move(info));
  }
  std::sort(out.begin(), out.end(), [](const checkpoint_info& a, const checkpoint_info& b) {
    return a.step != b.step ? a.step < b.step : a.path < b.path;
  });
  return out;
}

std::vector<checkpoint_info> checkpoint_store::list() const {
  auto r = try_list();
  if (!r) {
    spdlog::warn("checkpoint list: {}", r.err().message);
    return {};
  }
  return std::move(r).value();
}

result<checkpoint_manifest> checkpoint_store::read_manifest(const fs::path& step_dir) const {
  auto p = step_dir / manifest_name;
  auto j = read_json(p);
  if (!j) {
    if (j.err().message == p.string() + ": missing")
      return invalid(p, "missing (checkpoint incomplete, or not a Grace checkpoint)");
    return j.err();
  }
  return manifest_from_json(p, *j);
}

result<std::vector<stored_tensor>> checkpoint_store::read_tensors(const fs::path& step_dir) const {
  auto m = read_manifest(step_dir);
  if (!m) return m.err();
  std::vector<stored_tensor> out;
  for (auto& f : m->files) {
    const std::string suffix = ".safetensors";
    if (f.name.size() < suffix.size() || f.name.compare(f.name.size() - suffix.size(), suffix.size(), suffix) != 0)
      continue;
    auto h = safetensors::read_header(step_dir / f.name);
    if (!h) return h.err();
    for (auto& t : h->tensors) out.push_back({t.name, t.type, t.shape, t.bytes(), f.name});
  }
  return out;
}

status checkpoint_store::verify(uint64_t step) const { return verify(step_path(step)); }

namespace {

struct shard_layout {
  const checkpoint_file* file; ///< its manifest entry
  safetensors::header h;
};

/// A step directory checked down to, but not including, the file checksums.
struct step_contents {
  checkpoint_manifest manifest;
  std::vector<shard_layout> shards;
};

/// Manifest, directory name, every listed file present, every shard header
/// valid, the index agreeing with the shards. A header or index that does
/// not parse is first checked against its checksum: "file corrupted" says
/// more than the parse error it causes.
result<step_contents> check_structure(const checkpoint_store& store, const fs::path& step_dir) {
  auto m = store.read_manifest(step_dir);
  if (!m) return m.err();
  uint64_t name_step = 0;
  if (parse_step_name(step_dir.filename().string(), name_step) && name_step != m->step)
    return invalid(step_dir, "directory is step " + std::to_string(name_step) + " but the manifest says " +
                                 std::to_string(m->step));
  step_contents out;
  out.manifest = std::move(*m);
  const checkpoint_file* index = nullptr;
  for (auto& f : out.manifest.files) {
    auto p = step_dir / f.name;
    std::error_code ec;
    if (!fs::is_regular_file(fs::status(p, ec))) return invalid(p, "missing");
    if (f.name == index_name) index = &f;
    if (!is_shard(f.name)) continue;
    auto h = safetensors::read_header(p);
    if (!h) {
      if (auto c = check_file(step_dir, f); !c) return c.err();
      return h.err();
    }
    out.shards.push_back({&f, std::move(*h)});
  }
  if (index) {
    auto ip = step_dir / index_name;
    auto check_index = [&]() -> status {
      auto j = read_json(ip);
      if (!j) return j.err();
      auto wm = j->find("weight_map");
      if (wm == j->end() || !wm->is_object()) return invalid(ip, "no weight_map object");
      std::map<std::string, std::string> where;
      for (auto& s : out.shards)
        for (auto& t : s.h.tensors) where[t.name] = s.file->name;
      for (auto& [name, file] : wm->items()) {
        if (!file.is_string()) return invalid(ip, "weight_map entry '" + name + "' is not a string");
        auto it = where.find(name);
        if (it == where.end() || it->second != file.get<std::string>())
          return invalid(ip, "weight_map says '" + name + "' is in " + file.get<std::string>() +
                                 ", which does not hold it");
      }
      return {};
    };
    if (auto st = check_index(); !st) {
      if (auto c = check_file(step_dir, *index); !c) return c.err();
      return st.err();
    }
  }
  return out;
}

status check_files(const fs::path& step_dir, const checkpoint_manifest& m) {
  for (auto& f : m.files)
    if (auto st = check_file(step_dir, f); !st) return st;
  return {};
}

} // namespace

status checkpoint_store::verify(const fs::path& step_dir) const {
  auto c = check_structure(*this, step_dir);
  if (!c) return c.err();
  return check_files(step_dir, c->manifest);
}

result<restored_checkpoint> checkpoint_store::load(const fs::path& step_dir, const std::vector<tensor_ref>& into,
                                                   const std::vector<void*>& staging, bool& corrupt) const {
  corrupt = true;
  auto c = check_structure(*this, step_dir);
  if (!c) return c.err();
  struct located {
    size_t shard;
    const safetensors::tensor_entry* e;
  };
  std::unordered_map<std::string, located> by_name;
  for (size_t s = 0; s < c->shards.size(); ++s)
    for (auto& e : c->shards[s].h.tensors) by_name[e.name] = located{s, &e};

  // Check everything before writing a byte into the caller's memory, so a
  // mismatch leaves the registered tensors untouched. A mismatch in a
  // checkpoint that fails its checksums is corruption (skip it), otherwise
  // the caller's error.
  auto caller_error = [&](error e) -> error {
    if (auto v = check_files(step_dir, c->manifest); !v) return v.err();
    corrupt = false;
    return e;
  };
  if (!staging.empty() && staging.size() != into.size()) {
    corrupt = false;
    return error{errc::invalid_input, "restore staging has " + std::to_string(staging.size()) +
                                          " buffers for " + std::to_string(into.size()) + " tensors"};
  }
  std::set<std::string> registered;
  size_t total = 0;
  for (auto& t : into) {
    registered.insert(t.name);
    auto it = by_name.find(t.name);
    if (it == by_name.end())
      return caller_error(invalid(step_dir, "registered tensor '" + t.name + "' is missing from the checkpoint"));
    auto& e = *it->second.e;
    if (e.type != t.type || e.shape != t.shape)
      return caller_error(invalid(step_dir, "tensor '" + t.name + "': expected " + dtype_name(t.type) + " " +
                                                shape_str(t.shape) + ", checkpoint has " + dtype_name(e.type) +
                                                " " + shape_str(e.shape)));
    if (t.memory == memory_kind::device && !device_copy_available()) {
      corrupt = false;
      return error{errc::failed, "tensor '" + t.name +
                                     "': device tensors need the CUDA backend (this process has not "
                                     "registered its device copy; see runtime/device_copy.hpp)"};
    }
    if (!t.data && e.bytes() > 0) {
      corrupt = false;
      return error{errc::invalid_input, "tensor '" + t.name + "' has no " +
                                            (t.memory == memory_kind::device ? "device" : "host") +
                                            " memory to restore into"};
    }
    total += static_cast<size_t>(e.bytes());
  }

  // One pass over every file: read (O_DIRECT), hash, and scatter the
  // registered tensors' bytes into the staging buffers. Only when every
  // checksum matched do the bytes move on to the caller's tensors.
  std::unique_ptr<unsigned char[]> own;
  std::vector<unsigned char*> dst(into.size());
  if (staging.empty()) {
    own.reset(new unsigned char[total + 1]);
    size_t at = 0;
    for (size_t i = 0; i < into.size(); ++i) {
      dst[i] = own.get() + at;
      at += static_cast<size_t>(by_name.at(into[i].name).e->bytes());
    }
  } else {
    for (size_t i = 0; i < into.size(); ++i) dst[i] = static_cast<unsigned char*>(staging[i]);
  }
  struct target {
    uint64_t begin, end; ///< absolute file offsets
    unsigned char* dst;
  };
  std::vector<std::vector<target>> targets(c->shards.size());
  for (size_t i = 0; i < into.size(); ++i) {
    auto& l = by_name.at(into[i].name);
    if (l.e->bytes() == 0) continue;
    const uint64_t base = c->shards[l.shard].h.data_start;
    targets[l.shard].push_back({base + l.e->begin, base + l.e->end, dst[i]});
  }
  for (auto& t : targets)
    std::sort(t.begin(), t.end(), [](const target& a, const target& b) { return a.begin < b.begin; });
  for (auto& f : c->manifest.files) {
    chunk_sink sink;
    const std::vector<target>* ts = nullptr;
    for (size_t s = 0; s < c->shards.size(); ++s)
      if (c->shards[s].file == &f) ts = &targets[s];
    size_t first = 0;
    if (ts && !ts->empty())
      sink = [ts, &first](uint64_t off, const unsigned char* p, size_t n) {
        const uint64_t end = off + n;
        while (first < ts->size() && (*ts)[first].end <= off) ++first;
        for (size_t k = first; k < ts->size() && (*ts)[k].begin < end; ++k) {
          const auto& t = (*ts)[k];
          const uint64_t b = std::max(t.begin, off), e = std::min(t.end, end);
          std::memcpy(t.dst + (b - t.begin), p + (b - off), static_cast<size_t>(e - b));
        }
      };
    if (auto st = check_file(step_dir, f, sink, restore_checksums_); !st) return st.err();
  }

  corrupt = false;
  restored_checkpoint out;
  for (size_t i = 0; i < into.size(); ++i) {
    auto& t = into[i];
    const size_t bytes = static_cast<size_t>(by_name.at(t.name).e->bytes());
    if (bytes > 0) {
      if (t.memory == memory_kind::device) {
        if (auto st = device_copy_to_device(t.data, dst[i], bytes, t.device); !st)
          return error{st.err().code, "tensor '" + t.name + "': " + st.err().message};
      } else if (t.data != dst[i]) {
        copy_large(t.data, dst[i], bytes);
      }
    }
    out.loaded.push_back(t.name);
  }
  for (auto& [name, l] : by_name)
    if (!registered.count(name)) out.unregistered.push_back(name);
  std::sort(out.unregistered.begin(), out.unregistered.end());
  out.found = true;
  out.path = step_dir;
  out.manifest = std::move(c->manifest);
  return out;
}

result<restored_checkpoint> checkpoint_store::restore_latest(const std::vector<tensor_ref>& into,
                                                             const std::vector<void*>& staging) const {
  auto all = try_list();
  if (!all) return all.err();
  std::vector<skipped_checkpoint> skipped;
  for (auto it = all->rbegin(); it != all->rend(); ++it) {
    if (it->temporary || it->set_aside) continue;
    bool corrupt = false;
    auto r = load(it->path, into, staging, corrupt);
    if (!r) {
      if (!corrupt) return r.err();
      spdlog::warn("checkpoint {}: skipped on restore: {}", it->path.string(), r.err().message);
      skipped.push_back({it->step, it->path, r.err().message});
      continue;
    }
    r->skipped = std::move(skipped);
    spdlog::info("restored checkpoint step {} from {} ({} tensors, {} unregistered ignored, {} newer skipped)",
                 r->manifest.step, r->path.string(), r->loaded.size(), r->unregistered.size(),
                 r->skipped.size());
    return r;
  }
  if (!skipped.empty())
    spdlog::error("checkpoint directory {}: {} checkpoint(s) present but none verifies; starting fresh",
                  dir_.string(), skipped.size());
  restored_checkpoint none;
  none.skipped = std::move(skipped);
  return none;
}

result<restored_checkpoint> checkpoint_store::restore(uint64_t step, const std::vector<tensor_ref>& into,
                                                      const std::vector<void*>& staging) const {
  auto p = step_path(step);
  std::error_code ec;
  if (!fs::exists(p, ec)) return invalid(p, "no checkpoint for step " + std::to_string(step));
  bool corrupt = false;
  return load(p, into, staging, corrupt);
}

std::vector<fs::path> checkpoint_store::stale_temporaries() const {
  std::vector<fs::path> out;
  std::error_code ec;
  for (auto it = fs::directory_iterator(dir_, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    auto name = it->path().filename().string();
    uint64_t step = 0;
    long pid = 0;
    if (!parse_tmp_name(name, step, pid)) continue;
    bool ours = pid == static_cast<long>(::getpid());
    if (ours ? !is_active_temp(it->path()) : !pid_alive(pid)) out.push_back(it->path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

void checkpoint_store::remove_stale_temporaries() {
  if (!clean_temporaries_) return;
  for (auto& p : stale_temporaries()) {
    std::error_code ec;
    fs::remove_all(p, ec);
    if (ec)
      spdlog::warn("checkpoint: cannot remove stale temporary {}: {}", p.string(), ec.message());
    else
      spdlog::warn("checkpoint: removed stale temporary {} left by a crashed writer", p.string());
  }
}

} // namespace grace
