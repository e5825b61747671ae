#pragma once
/// Direct (O_DIRECT) file I/O for checkpoints: the aligned staging pair,
/// output files hashed as they are written, files streamed and hashed as
/// they are read, and directory fsync.
///
/// Why O_DIRECT: through the page cache a save beyond ~256 MiB runs at
/// 0.3-0.4 GB/s here (the kernel must first take memory back from the host
/// and throttles dirty pages); O_DIRECT runs at disk speed. Every path
/// falls back to buffered I/O where the filesystem refuses O_DIRECT, and
/// the bytes on disk are the same either way.

#include <sys/types.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <future>
#include <memory>
#include <mutex>

#include "runtime/base/error.hpp"
#include "runtime/base/posix_file.hpp"

struct XXH3_state_s;

namespace grace {

/// The staging for O_DIRECT reads and writes: a pair of 4096-aligned
/// buffers of 64 MiB, kept for the life of its owner (a `checkpoint_store`)
/// and reused by its saves and restores. Touching fresh pages runs far
/// below memcpy speed (and slower still after idle on a VM that hands
/// memory back to its host), which would eat much of what O_DIRECT gains.
/// A second save or restore running at the same time gets a pair of its
/// own, freed after. Thread-safe.
class io_staging {
  struct free_deleter {
    void operator()(unsigned char* p) const noexcept { std::free(p); }
  };

public:
  static constexpr size_t align = 4096;
  static constexpr int count = 2;  ///< two I/Os in flight while the caller copies and hashes
  static constexpr size_t bytes = 64u << 20;
  /// Files at least this big are read with O_DIRECT, smaller ones buffered.
  static constexpr uint64_t direct_read_min = 8u << 20;

  using buffer_pair = std::array<std::unique_ptr<unsigned char, free_deleter>, count>;

  /// One pair held by one save or restore: the idle pair when there is
  /// one, else a new one. Returned on destruction (freed when another pair
  /// went back first).
  class lease {
  public:
    explicit lease(io_staging& owner);
    ~lease();
    lease(const lease&) = delete;
    lease& operator=(const lease&) = delete;
    unsigned char* operator[](int i) const noexcept { return pair_[i].get(); }

  private:
    io_staging& owner_;
    buffer_pair pair_;
  };

  /// Faults in the idle pair as far as a state of `state_bytes` uses it,
  /// so the first save or restore does not touch fresh pages on its
  /// critical path. Idempotent.
  void prepare(uint64_t state_bytes);
  /// Reads one byte per prepared page while no save or restore holds the
  /// pair, so a VM that reclaims idle memory does not take these pages.
  void keep_warm();

private:
  buffer_pair take();
  void give_back(buffer_pair p) noexcept;

  std::mutex idle_mutex_;
  buffer_pair idle_;  ///< empty (null pointers) while leased or never allocated
  /// Held across `prepare` and `keep_warm`; taken before `idle_mutex_`.
  std::mutex prepared_mutex_;
  std::array<size_t, count> prepared_{};  ///< bytes of each idle buffer touched so far; only grows
};

/// A running xxh3-64 over bytes handed in order.
class xxh3_hash {
public:
  xxh3_hash();
  ~xxh3_hash();
  xxh3_hash(const xxh3_hash&) = delete;
  xxh3_hash& operator=(const xxh3_hash&) = delete;
  void update(const void* p, size_t n) noexcept;
  uint64_t digest() const noexcept;

private:
  XXH3_state_s* state_;
};

/// One output file: sequential writes with the checksum computed on the fly.
///
/// Direct mode: the bytes are copied into the staging pair and written with
/// O_DIRECT at 64 MiB offsets, one thread per write, so up to two writes
/// are in flight while the caller's thread copies and hashes. The last
/// block is zero-padded to the alignment and the file truncated back to its
/// true size, so the bytes, and therefore the checksums, are exactly those
/// of a buffered write. Filesystems without O_DIRECT (open fails with
/// EINVAL) and writes the kernel refuses as unaligned (EINVAL) fall back to
/// buffered I/O.
class hashed_file {
public:
  hashed_file() = default;
  ~hashed_file();
  hashed_file(const hashed_file&) = delete;
  hashed_file& operator=(const hashed_file&) = delete;

  /// Creates `p` (it must not exist) and reserves `expected_size` bytes.
  /// `staging`: write with O_DIRECT through it; null: buffered.
  status open(const std::filesystem::path& p, uint64_t expected_size, io_staging* staging = nullptr);
  status write(const void* data, size_t n);
  /// Completes outstanding writes (direct mode: the padded last block, then
  /// truncation to the true size) and releases the staging pair.
  status flush();
  /// Flushes, fsyncs and closes.
  status finish();

  const std::filesystem::path& path() const noexcept { return path_; }
  /// Bytes written, without padding.
  uint64_t size() const noexcept { return size_; }
  /// xxh3-64 of the bytes written.
  uint64_t digest() const noexcept { return hash_.digest(); }

private:
  status write_buffered(const char* p, size_t n);
  status write_direct(const unsigned char* p, size_t n);
  void submit();
  status wait(int i);
  void wait_all() noexcept;
  error fail(const char* what, int e) const;

  std::filesystem::path path_;
  fd_guard f_;
  xxh3_hash hash_;
  uint64_t size_ = 0;                                        ///< bytes accepted (and hashed) so far, without padding
  std::unique_ptr<io_staging::lease> lease_;                 ///< set in direct mode until flushed
  size_t fill_ = 0;                                          ///< bytes in the current staging buffer
  int cur_ = 0;                                              ///< the staging buffer being filled
  std::array<std::future<int>, io_staging::count> pending_;  ///< each buffer's write in flight (errno or 0)
};

/// `pread` until `n` bytes or the end of the file: the count, or -errno. An
/// O_DIRECT refusal (EINVAL) switches the descriptor to buffered reads.
ssize_t pread_full(int fd, unsigned char* buf, size_t n, off_t off);

/// Receives a file's bytes in order: (file offset, bytes, count).
using chunk_sink = std::function<void(uint64_t, const unsigned char*, size_t)>;

/// Reads a whole file front to back once, hashing it with xxh3 and handing
/// every piece to `sink` (may be empty); returns the hash.
///
/// The file must be `expected_size` bytes (the manifest's). Files of at
/// least `io_staging::direct_read_min` are read with O_DIRECT into a pair
/// leased from `staging`, each 64 MiB chunk as two concurrent 32 MiB reads,
/// the next chunk in flight while this one is hashed and handed on: no
/// page-cache pages to allocate (slow on VMs that hand idle memory back to
/// the host, as for writes) and two requests queued at the disk, where a
/// buffered read leaves it to readahead. Small files, and filesystems
/// without O_DIRECT, are read buffered.
result<uint64_t> stream_file(const std::filesystem::path& p, uint64_t expected_size, const chunk_sink& sink,
                             io_staging& staging);

/// fsync of a directory (makes renames and new entries in it durable).
status fsync_dir(const std::filesystem::path& d);

}  // namespace grace
