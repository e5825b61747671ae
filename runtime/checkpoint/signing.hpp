#pragma once
/// Signed checkpoints: the manifest carries an HMAC-SHA256 over its own
/// content, which lists every file's size and checksum. Whoever can write
/// the checkpoint directory but lacks the key cannot plant a step that a
/// signing job restores. The signature is one extra manifest field,
/// `"signature": {"algorithm": "HMAC-SHA256", "key_id": ..., "mac": ...}`;
/// readers without Grace ignore it.
///
/// What is signed: the manifest JSON without its `signature` field, dumped
/// compactly with sorted keys (nlohmann::json's `dump()`), as a reader
/// parses it back. The key id is a hash of the key, so an error can say
/// which key signed a step without revealing the key.

#include "runtime/base/error.hpp"

#include <nlohmann/json_fwd.hpp>

#include <filesystem>
#include <optional>
#include <string>

namespace grace {

/// Shorter checkpoint keys are refused (32 bytes: 256 bits when random).
inline constexpr std::size_t min_checkpoint_key_bytes = 32;

struct checkpoint_key {
  std::string secret;  ///< the HMAC key
  std::string id;      ///< 16 hex digits naming it in manifests and errors
  /// Where it came from ("--checkpoint-key-file F", "the job's secret").
  std::string origin;
};

/// A long-lived key for checkpoints that outlive jobs: a file of mode 600
/// holding at least 32 characters (e.g. `openssl rand -hex 32`).
result<checkpoint_key> read_checkpoint_key_file(const std::string& path);
/// A key derived from the job's secret (HMAC of a fixed label): every
/// member of the job derives the same one; it lives as long as the secret.
checkpoint_key checkpoint_key_from_job_secret(const std::string& job_secret);
/// A key from its bytes (tests, tools).
checkpoint_key make_checkpoint_key(std::string secret, std::string origin);

/// Adds (or replaces) the signature field.
void sign_manifest(nlohmann::json& manifest, const checkpoint_key& key);
/// Empty when `manifest` carries a signature by `key` over its content;
/// else why not (unsigned, signed with another key, changed since).
std::string manifest_signature_problem(const nlohmann::json& manifest, const checkpoint_key& key);
/// The key id a manifest's signature names; empty when it has none.
std::string manifest_key_id(const nlohmann::json& manifest);

/// Signs the manifest of a committed step directory with `key` in place
/// (a new file fsynced, renamed over the old, the directory fsynced): what
/// `grace-ckpt sign` does to adopt checkpoints written unsigned. The
/// caller verifies the step's checksums first.
status sign_step_manifest(const std::filesystem::path& step_dir, const checkpoint_key& key);

/// --checkpoint-signing (GRACE_CHECKPOINT_SIGNING for workers):
/// auto: a --checkpoint-key-file if given, else the job's secret when it
///   was given (a token file or GRACE_TOKEN: it outlives one launcher
///   run), else unsigned (one node's random secret dies with the launcher,
///   and a rerun could restore nothing signed with it);
/// job: the key file, else the job's secret even when it is random (the
///   checkpoints then restore only within this run of the job);
/// off: unsigned, and no signature is checked.
enum class signing_mode { automatic, job, off };
result<signing_mode> parse_signing_mode(const std::string& text, const std::string& origin);
const char* to_string(signing_mode m);

/// The key a process signs and checks with (none: unsigned, unchecked).
/// `secret_given`: the job's secret came from its owner, not at random.
result<std::optional<checkpoint_key>> choose_checkpoint_key(const std::string& key_file, signing_mode mode,
                                                            const std::string& job_secret, bool secret_given);

}  // namespace grace
