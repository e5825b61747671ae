#include "runtime/checkpoint/signing.hpp"

#include "runtime/checkpoint/direct_io.hpp"
#include "runtime/checkpoint/manifest.hpp"

#include "runtime/net/hmac.hpp"
#include "runtime/net/job_token.hpp"

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace grace {

namespace {

using json = nlohmann::json;

constexpr const char* algorithm = "HMAC-SHA256";

/// The bytes a signature covers: the manifest without its signature.
std::string signed_text(const json& manifest) {
  json copy = manifest;
  copy.erase("signature");
  return copy.dump();
}

}  // namespace

checkpoint_key make_checkpoint_key(std::string secret, std::string origin) {
  checkpoint_key k;
  k.id = to_hex(sha256("grace checkpoint key id\n" + secret)).substr(0, 16);
  k.secret = std::move(secret);
  k.origin = std::move(origin);
  return k;
}

result<checkpoint_key> read_checkpoint_key_file(const std::string& path) {
  auto text = read_private_file(path, "--checkpoint-key-file");
  if (!text) return text.err();
  if (text->size() < min_checkpoint_key_bytes)
    return invalid_input("--checkpoint-key-file " + path + " holds " + std::to_string(text->size()) +
                         " characters: a checkpoint key must be at least " + std::to_string(min_checkpoint_key_bytes) +
                         " (e.g. `openssl rand -hex 32 > " + path + "`)");
  return make_checkpoint_key(std::move(*text), "--checkpoint-key-file " + path);
}

checkpoint_key checkpoint_key_from_job_secret(const std::string& job_secret) {
  return make_checkpoint_key(hmac_sha256(job_secret, "grace checkpoint signing key v1"), "the job's secret");
}

void sign_manifest(json& manifest, const checkpoint_key& key) {
  // Signed as a reader sees it: parsed back from the text written.
  const std::string mac = to_hex(hmac_sha256(key.secret, signed_text(json::parse(manifest.dump()))));
  manifest["signature"] = json{{"algorithm", algorithm}, {"key_id", key.id}, {"mac", mac}};
}

std::string manifest_key_id(const json& manifest) {
  auto s = manifest.find("signature");
  if (s == manifest.end() || !s->is_object()) return "";
  auto id = s->find("key_id");
  return id != s->end() && id->is_string() ? id->get<std::string>() : "";
}

std::string manifest_signature_problem(const json& manifest, const checkpoint_key& key) {
  if (!manifest.is_object()) return "manifest is not a JSON object";
  auto s = manifest.find("signature");
  if (s == manifest.end())
    return "unsigned, and this job restores only checkpoints signed with key " + key.id + " (" + key.origin + ")";
  if (!s->is_object() || !s->contains("algorithm") || !s->contains("key_id") || !s->contains("mac") ||
      !(*s)["algorithm"].is_string() || !(*s)["key_id"].is_string() || !(*s)["mac"].is_string())
    return "malformed signature field";
  if ((*s)["algorithm"] != algorithm)
    return "signed with " + (*s)["algorithm"].get<std::string>() + ", not " + algorithm;
  if ((*s)["key_id"] != key.id)
    return "signed with another key (key id " + (*s)["key_id"].get<std::string>() + "; this job's key is " + key.id +
           ", " + key.origin + ")";
  const std::string want = to_hex(hmac_sha256(key.secret, signed_text(manifest)));
  if (!constant_time_equal(want, (*s)["mac"].get<std::string>()))
    return "signature does not match the manifest (key id " + key.id +
           "): the manifest was changed after it was signed, or the signature is forged";
  return "";
}

status sign_step_manifest(const std::filesystem::path& step_dir, const checkpoint_key& key) {
  const auto p = step_dir / manifest_file_name;
  auto j = read_json(p);
  if (!j) return j.err();
  sign_manifest(*j, key);
  const std::string text = j->dump(2) + "\n";
  const auto tmp = step_dir / (std::string(manifest_file_name) + ".signing");
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return error{errc::failed, tmp.string() + ": " + std::strerror(errno)};
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  const bool ok = done == text.size() && ::fsync(fd) == 0;
  const int saved = errno;
  ::close(fd);
  if (!ok || ::rename(tmp.c_str(), p.c_str()) != 0) {
    const std::string why = std::strerror(ok ? errno : saved);
    ::unlink(tmp.c_str());
    return error{errc::failed, p.string() + ": cannot write the signed manifest: " + why};
  }
  return fsync_dir(step_dir);
}

result<signing_mode> parse_signing_mode(const std::string& text, const std::string& origin) {
  if (text == "auto") return signing_mode::automatic;
  if (text == "job") return signing_mode::job;
  if (text == "off") return signing_mode::off;
  return invalid_input(origin + " '" + text + "': expected auto, job or off");
}

const char* to_string(signing_mode m) {
  switch (m) {
    case signing_mode::automatic: return "auto";
    case signing_mode::job: return "job";
    case signing_mode::off: return "off";
  }
  return "?";
}

result<std::optional<checkpoint_key>> choose_checkpoint_key(const std::string& key_file, signing_mode mode,
                                                            const std::string& job_secret, bool secret_given) {
  using key = std::optional<checkpoint_key>;
  if (mode == signing_mode::off) {
    if (!key_file.empty())
      return invalid_input("--checkpoint-key-file " + key_file + " with --checkpoint-signing off: give one of them");
    return key();
  }
  if (!key_file.empty()) {
    auto k = read_checkpoint_key_file(key_file);
    if (!k) return k.err();
    return key(std::move(*k));
  }
  if (mode == signing_mode::automatic && !secret_given) return key();
  if (job_secret.empty())
    return invalid_input("checkpoints signed with the job's secret were asked for, but this job has none: give "
                         "--checkpoint-key-file, or a secret (GRACE_TOKEN, --token-file)");
  return key(checkpoint_key_from_job_secret(job_secret));
}

}  // namespace grace
