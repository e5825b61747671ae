#include "runtime/checkpoint/direct_io.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>
#include <string>

#include <xxhash.h>

namespace grace {

namespace fs = std::filesystem;

namespace {

constexpr size_t write_chunk = 64u << 20;  ///< buffered writes: large sequential writes
constexpr size_t read_chunk = 8u << 20;    ///< buffered reads

size_t align_up(size_t n, size_t a) { return (n + a - 1) & ~(a - 1); }

/// After an I/O on `fd` failed with `e`: an O_DIRECT refusal (EINVAL, e.g.
/// an unaligned request) switches the descriptor to buffered I/O; true when
/// it did, so the I/O can be retried.
bool retry_buffered(int fd, int e) {
  const int fl = e == EINVAL ? ::fcntl(fd, F_GETFL) : -1;
  return fl >= 0 && (fl & O_DIRECT) && ::fcntl(fd, F_SETFL, fl & ~O_DIRECT) == 0;
}

}  // namespace

// ------------------------------------------------------------- io_staging

io_staging::lease::lease(io_staging& owner) : owner_(owner), pair_(owner.take()) {}

io_staging::lease::~lease() { owner_.give_back(std::move(pair_)); }

io_staging::buffer_pair io_staging::take() {
  {
    std::lock_guard<std::mutex> lk(idle_mutex_);
    if (idle_[0]) return std::move(idle_);
  }
  buffer_pair p;
  for (auto& b : p) {
    void* mem = nullptr;
    if (::posix_memalign(&mem, align, bytes) != 0) throw std::bad_alloc();
    b.reset(static_cast<unsigned char*>(mem));
  }
  return p;
}

void io_staging::give_back(buffer_pair p) noexcept {
  std::lock_guard<std::mutex> lk(idle_mutex_);
  if (!idle_[0]) idle_ = std::move(p);
}

void io_staging::prepare(uint64_t state_bytes) {
  // Files below the O_DIRECT thresholds never use the pair.
  if (state_bytes < direct_read_min) return;
  std::lock_guard<std::mutex> lk(prepared_mutex_);
  lease bufs(*this);
  // Chunk i of a file lands in buffer i % count: a state of B bytes uses
  // min(B - i * bytes, bytes) of buffer i, when positive (plus a header and
  // alignment: round up to whole pages).
  const uint64_t want = state_bytes + align;
  for (int i = 0; i < count; ++i) {
    const uint64_t start = uint64_t(i) * bytes;
    if (want <= start) break;
    const size_t n = static_cast<size_t>(std::min<uint64_t>(want - start, bytes));
    if (n <= prepared_[i]) continue;
    std::memset(bufs[i] + prepared_[i], 0, n - prepared_[i]);
    prepared_[i] = n;
  }
}

void io_staging::keep_warm() {
  std::lock_guard<std::mutex> prepared_lock(prepared_mutex_);
  std::lock_guard<std::mutex> idle_lock(idle_mutex_);
  if (!idle_[0]) return;  // leased by a save or restore, or never allocated
  for (int i = 0; i < count; ++i) {
    unsigned sink = 0;
    const volatile unsigned char* p = idle_[i].get();
    for (size_t off = 0; off < prepared_[i]; off += align) sink += p[off];
    (void)sink;
  }
}

// -------------------------------------------------------------- xxh3_hash

xxh3_hash::xxh3_hash() : state_(XXH3_createState()) {
  if (!state_) throw std::bad_alloc();
  XXH3_64bits_reset(state_);
}

xxh3_hash::~xxh3_hash() { XXH3_freeState(state_); }

void xxh3_hash::update(const void* p, size_t n) noexcept { XXH3_64bits_update(state_, p, n); }

uint64_t xxh3_hash::digest() const noexcept { return XXH3_64bits_digest(state_); }

// ------------------------------------------------------------ hashed_file

namespace {

/// Returns 0 or an errno. An unaligned-I/O refusal (EINVAL) switches the
/// descriptor to buffered writes and retries.
int pwrite_all(int fd, const unsigned char* buf, size_t n, off_t off) {
  size_t done = 0;
  while (done < n) {
    ssize_t r = ::pwrite(fd, buf + done, n - done, off + static_cast<off_t>(done));
    if (r < 0) {
      const int e = errno;
      if (e == EINTR || retry_buffered(fd, e)) continue;
      return e;
    }
    if (r == 0) return ENOSPC;
    done += static_cast<size_t>(r);
  }
  return 0;
}

}  // namespace

hashed_file::~hashed_file() { wait_all(); }

void hashed_file::wait_all() noexcept {
  for (auto& p : pending_)
    if (p.valid()) p.wait();  // before the buffers and the fd go away
}

status hashed_file::open(const fs::path& p, uint64_t expected_size, io_staging* staging) {
  path_ = p;
  constexpr int flags = O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC;
  if (staging) {
    f_.fd = ::open(p.c_str(), flags | O_DIRECT, 0644);
    if (f_.fd >= 0) {
      lease_ = std::make_unique<io_staging::lease>(*staging);
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

status hashed_file::write(const void* data, size_t n) {
  if (lease_) return write_direct(static_cast<const unsigned char*>(data), n);
  return write_buffered(static_cast<const char*>(data), n);
}

status hashed_file::write_buffered(const char* p, size_t n) {
  while (n > 0) {
    size_t chunk = std::min(n, write_chunk);
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
    hash_.update(p, chunk);
    size_ += chunk;
    p += chunk;
    n -= chunk;
  }
  return {};
}

status hashed_file::write_direct(const unsigned char* p, size_t n) {
  while (n > 0) {
    if (fill_ == 0)
      if (auto st = wait(cur_); !st) return st;  // the buffer's previous write
    size_t k = std::min(n, io_staging::bytes - fill_);
    std::memcpy((*lease_)[cur_] + fill_, p, k);
    fill_ += k;
    p += k;
    n -= k;
    if (fill_ == io_staging::bytes) submit();
  }
  return {};
}

/// Starts writing the current buffer at the file's end, then hashes it
/// while the write (and possibly the other buffer's) is in flight.
void hashed_file::submit() {
  unsigned char* buf = (*lease_)[cur_];
  const size_t len = fill_;
  const size_t padded = align_up(len, io_staging::align);
  std::memset(buf + len, 0, padded - len);
  const off_t off = static_cast<off_t>(size_);
  const int fd = f_.fd;
  pending_[cur_] = std::async(std::launch::async, [fd, buf, padded, off] { return pwrite_all(fd, buf, padded, off); });
  hash_.update(buf, len);
  size_ += len;
  fill_ = 0;
  cur_ = (cur_ + 1) % io_staging::count;
}

status hashed_file::wait(int i) {
  if (!pending_[i].valid()) return {};
  int e = pending_[i].get();
  if (e != 0) return fail("write failed", e);
  return {};
}

status hashed_file::flush() {
  if (!lease_) return {};
  if (fill_ > 0) submit();
  for (int i = 0; i < io_staging::count; ++i)
    if (auto st = wait(i); !st) return st;
  if (::ftruncate(f_.fd, static_cast<off_t>(size_)) != 0) return fail("truncate failed", errno);
  // Every write is done: the staging pair goes back for the next file
  // while this one is still being fsynced.
  lease_.reset();
  return {};
}

status hashed_file::finish() {
  if (auto st = flush(); !st) return st;
  if (::fsync(f_.fd) != 0) return fail("fsync failed", errno);
  int fd = f_.fd;
  f_.fd = -1;
  if (::close(fd) != 0) return fail("close failed", errno);
  return {};
}

error hashed_file::fail(const char* what, int e) const {
  return error{errc::failed, path_.string() + ": " + what + ": " + errno_str(e)};
}

// ------------------------------------------------------------ reading

ssize_t pread_full(int fd, unsigned char* buf, size_t n, off_t off) {
  size_t done = 0;
  while (done < n) {
    ssize_t r = ::pread(fd, buf + done, n - done, off + static_cast<off_t>(done));
    if (r < 0) {
      const int e = errno;
      if (e == EINTR || retry_buffered(fd, e)) continue;
      return -e;
    }
    if (r == 0) break;
    done += static_cast<size_t>(r);
  }
  return static_cast<ssize_t>(done);
}

namespace {

/// Opens `p` for reading (O_DIRECT when `direct` is true and allowed) and
/// checks that it is a regular file of `expected_size` bytes.
status open_sized(const fs::path& p, uint64_t expected_size, bool& direct, fd_guard& f) {
  if (direct) {
    f.fd = open_no_follow(p, O_RDONLY | O_DIRECT);
    direct = f.fd >= 0;
  }
  if (f.fd < 0) f.fd = open_no_follow(p, O_RDONLY);
  if (f.fd < 0) return invalid_file(p, open_failure(errno));
  struct stat sb {};
  if (::fstat(f.fd, &sb) != 0) return invalid_file(p, "cannot stat: " + errno_str(errno));
  if (!S_ISREG(sb.st_mode)) return invalid_file(p, "not a regular file");
  const auto size = static_cast<uint64_t>(sb.st_size);
  if (size != expected_size)
    return invalid_file(p, "size " + std::to_string(size) + " but the manifest says " + std::to_string(expected_size) +
                               " (truncated or partially written)");
  return {};
}

/// What a read that did not deliver every byte asked for means.
error short_read(const fs::path& p, ssize_t r) {
  return invalid_file(p, r < 0 ? "read failed: " + errno_str(static_cast<int>(-r))
                               : std::string("shorter than its size while reading (changed underneath?)"));
}

status stream_buffered(const fs::path& p, int fd, uint64_t size, const chunk_sink& sink, xxh3_hash& hash) {
  const size_t cap = static_cast<size_t>(std::min<uint64_t>(size, read_chunk));
  std::unique_ptr<unsigned char[]> buf(new unsigned char[cap + 1]);
  for (uint64_t off = 0; off < size;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(read_chunk, size - off));
    const ssize_t r = pread_full(fd, buf.get(), n, static_cast<off_t>(off));
    if (r != static_cast<ssize_t>(n)) return short_read(p, r);
    hash.update(buf.get(), n);
    if (sink) sink(off, buf.get(), n);
    off += n;
  }
  return {};
}

/// The direct read of one file: chunk i lives in staging buffer i % count and
/// is read as two concurrent halves. The reads in flight are declared
/// after the lease so they are waited for before the pair goes back, on
/// every path out.
class direct_reader {
public:
  direct_reader(int fd, uint64_t size, io_staging& staging)
      : fd_(fd), size_(size), chunks_((size + chunk - 1) / chunk), bufs_(staging) {}

  status run(const fs::path& p, const chunk_sink& sink, xxh3_hash& hash) {
    for (uint64_t i = 0; i < io_staging::count && i < chunks_; ++i) issue(i);
    for (uint64_t i = 0; i < chunks_; ++i) {
      for (auto& pc : inflight_[i % io_staging::count]) {
        if (pc.want == 0) continue;
        const ssize_t r = pc.read.get();
        if (r != static_cast<ssize_t>(pc.want)) return short_read(p, r);
      }
      const unsigned char* buf = bufs_[static_cast<int>(i % io_staging::count)];
      const uint64_t off = i * chunk;
      const size_t n = chunk_bytes(i);
      hash.update(buf, n);
      if (sink) sink(off, buf, n);
      if (i + io_staging::count < chunks_) issue(i + io_staging::count);
    }
    return {};
  }

private:
  static constexpr size_t chunk = io_staging::bytes, half = chunk / 2;
  struct piece {
    std::future<ssize_t> read;
    size_t want = 0;
  };

  size_t chunk_bytes(uint64_t i) const { return static_cast<size_t>(std::min<uint64_t>(chunk, size_ - i * chunk)); }

  void issue(uint64_t i) {
    unsigned char* buf = bufs_[static_cast<int>(i % io_staging::count)];
    auto& slot = inflight_[i % io_staging::count];
    const size_t n = chunk_bytes(i);
    const int fd = fd_;
    for (size_t h = 0; h < 2; ++h) {
      const size_t begin = h * half;
      slot[h].want = begin < n ? std::min(half, n - begin) : 0;
      if (slot[h].want == 0) continue;
      // Ask for whole blocks: at the end of the file the read stops short.
      const size_t ask = align_up(slot[h].want, io_staging::align);
      const off_t at = static_cast<off_t>(i * chunk + begin);
      slot[h].read =
          std::async(std::launch::async, [fd, buf, begin, ask, at] { return pread_full(fd, buf + begin, ask, at); });
    }
  }

  const int fd_;
  const uint64_t size_;
  const uint64_t chunks_;
  io_staging::lease bufs_;
  std::array<std::array<piece, 2>, io_staging::count> inflight_;
};

}  // namespace

result<uint64_t> stream_file(const fs::path& p, uint64_t expected_size, const chunk_sink& sink, io_staging& staging) {
  fd_guard f;
  bool direct = expected_size >= io_staging::direct_read_min;
  if (auto st = open_sized(p, expected_size, direct, f); !st) return st.err();
  xxh3_hash hash;
  status st = direct ? direct_reader(f.fd, expected_size, staging).run(p, sink, hash)
                     : stream_buffered(p, f.fd, expected_size, sink, hash);
  if (!st) return st.err();
  return hash.digest();
}

status fsync_dir(const fs::path& d) {
  fd_guard f(::open(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (f.fd < 0) return error{errc::failed, d.string() + ": cannot open directory for fsync: " + errno_str(errno)};
  if (::fsync(f.fd) != 0) return error{errc::failed, d.string() + ": fsync failed: " + errno_str(errno)};
  return {};
}

}  // namespace grace
