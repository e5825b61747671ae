#pragma once
/// Checkpoints on node-local disks: every grace-launch serves its node's
/// checkpoint directory read-only, and before it starts a group it fetches
/// the newest committed checkpoint a peer has and it lacks, so every rank
/// restores the same step (only the chief, or a just-in-time saver, writes a
/// checkpoint, and only on its own node's disk).
///
/// The fetched copy is written into `.tmp-step-<N>-<pid>-fetch`, verified
/// with the manifest's checksums (checkpoint_store::verify), and only then
/// renamed to `step-<N>`: a truncated or damaged transfer is never restored
/// (and a crashed fetch's temporary is cleaned like a crashed save's).
///
/// Protocol: the bulk channel's checkpoint kind (runtime/net/bulk_channel.hpp:
/// a hello proving the job's secret, then one request per connection):
///   request   "LIST\n"             -> "OK <n>\n" then n lines "<step>"
///             "FILES <step>\n"     -> "OK <n>\n" then n lines "<size> <name>"
///             "GET <step> <name>\n" -> "OK <size>\n" then the bytes
///             "PREPARED\n"         -> "OK <n>\n" then n lines "<step> <name>": parts
///               durable in parts directories, not committed here
///             "MIRRORED\n"         -> "OK <n>\n" then n lines "<step> <name> <xxh3>": parts
///               mirrored in the node's memory directory by replica holders (runtime/checkpoint/replica.hpp)
///             "PARTS <step> <tag>\n" -> "OK <n>\n" then n times "<size>\n" and
///               that many bytes: the part descriptions durable in `.parts-step-<N>-<tag>`
///               (node-local sharded state: a node's committer gathers every node's)
///   any error -> "ERR <one line>\n". Requests are at most 512 bytes; a peer
///   that stalls for `io_timeout` is dropped. Names are plain file names of
///   the step directory (no '/', no "..").

#include "runtime/base/error.hpp"
#include "runtime/checkpoint/signing.hpp"
#include "runtime/net/bulk_channel.hpp"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <set>
#include <string>
#include <memory>
#include <vector>

namespace grace {

/// Serves one checkpoint directory on `address` (port 0: any free port)
/// from its own thread until destroyed.
class checkpoint_server {
public:
  /// `memory_dir`: the node's memory directory, whose mirrored parts
  /// MIRRORED lists (empty: none). `key`: the job's checkpoint key (LIST
  /// then names only steps signed with it).
  static result<std::unique_ptr<checkpoint_server>> start(
      std::filesystem::path dir, std::string address, std::string token,
      std::chrono::milliseconds io_timeout = std::chrono::seconds(10), std::filesystem::path memory_dir = {},
      std::optional<checkpoint_key> key = {});
  ~checkpoint_server() = default;
  checkpoint_server(const checkpoint_server&) = delete;
  checkpoint_server& operator=(const checkpoint_server&) = delete;
  uint16_t port() const noexcept { return server_->port(); }
  /// "address:port"
  std::string endpoint() const { return server_->endpoint(); }

private:
  checkpoint_server() = default;
  void answer(int fd);
  std::filesystem::path dir_;
  std::filesystem::path memory_dir_;
  std::optional<checkpoint_key> key_;
  std::unique_ptr<bulk_server> server_;  ///< the bulk channel (runtime/net/bulk_channel.hpp); last: stops first
};

/// One peer's answer to LIST.
struct peer_checkpoints {
  std::string endpoint;         ///< "address:port"
  std::vector<uint64_t> steps;  ///< valid committed steps
};

/// Which peer to fetch which step from: the newest step any peer has, if it
/// is newer than `local_newest` (0: none); among the peers that have it, the
/// first. Nothing when no peer is ahead.
struct fetch_plan {
  uint64_t step = 0;
  std::string endpoint;
};
std::optional<fetch_plan> plan_fetch(uint64_t local_newest, const std::vector<peer_checkpoints>& peers);

/// A peer's valid committed steps. Errors: disconnected (unreachable within
/// `timeout`), failed (a protocol error, the message names it).
result<std::vector<uint64_t>> list_remote(const std::string& endpoint, const std::string& token,
                                          std::chrono::milliseconds timeout);

/// The files of the peer's committed step `step` (what it holds of a
/// node-local step).
result<std::set<std::string>> list_files_remote(const std::string& endpoint, const std::string& token, uint64_t step,
                                                std::chrono::milliseconds timeout);

/// The parts durable in the peer's parts directories (written, not
/// committed there): (step, data file) pairs.
result<std::vector<std::pair<uint64_t, std::string>>> list_prepared_remote(const std::string& endpoint,
                                                                         const std::string& token,
                                                                         std::chrono::milliseconds timeout);

/// A part a peer lists: its step, data file and (MIRRORED) checksum.
struct remote_part {
  uint64_t step = 0;
  std::string file;
  std::string xxh3;
};

/// The parts mirrored in the peer's memory directory (replicas that
/// outlived their workers), with the checksums their descriptions give.
result<std::vector<remote_part>> list_mirrored_remote(const std::string& endpoint, const std::string& token,
                                                      std::chrono::milliseconds timeout);

/// One small file of a peer's committed step (a manifest, an index), in
/// memory; at most `limit` bytes.
result<std::string> get_text_remote(const std::string& endpoint, const std::string& token, uint64_t step,
                                    const std::string& name, std::chrono::milliseconds timeout,
                                    uint64_t limit = uint64_t(16) << 20);

/// The part descriptions (checkpoint_store::part_description) durable in
/// the peer's parts directory of round `tag` of `step`.
result<std::vector<std::string>> list_parts_remote(const std::string& endpoint, const std::string& token,
                                                   uint64_t step, const std::string& tag,
                                                   std::chrono::milliseconds timeout);

/// Copies `step` from the peer into `dir`, verifies it, commits it as
/// `step-<N>`. Returns the bytes copied (0 if a valid copy was there already).
/// Without `with_parts` the parts of a node-local sharded step
/// (`rank-*.safetensors`) stay behind: the index, manifest and rank
/// states arrive, and the step is committed lacking every part (to be
/// filled in by fetch_part or checkpoint_store::adopt_part).
result<uint64_t> fetch_remote(const std::string& endpoint, const std::string& token, uint64_t step,
                              const std::filesystem::path& dir, std::chrono::milliseconds timeout,
                              bool with_parts = true, const checkpoint_key* key = nullptr);

/// Copies one part that node-local step `step` in `dir` lacks from the
/// peer, checks it against the local manifest and adds it to the step
/// (checkpoint_store::adopt_part). Returns its size.
result<uint64_t> fetch_part(const std::string& endpoint, const std::string& token, uint64_t step,
                            const std::string& name, const std::filesystem::path& dir,
                            std::chrono::milliseconds timeout);

}  // namespace grace
