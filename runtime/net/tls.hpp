#pragma once
/// TLS for the coordination traffic between a job's hosts. CAF's OpenSSL
/// module carries every member's and launcher's connection to the
/// coordination service over TLS 1.2 with mutual authentication: each side
/// presents a certificate signed by the job's CA and refuses a peer that
/// presents none or another one. Plain TCP stays the default (loopback).
///
/// The files are checked here, before the actor system starts, so that a
/// wrong file is a clear error naming it: CAF would only fail later, inside
/// a connection handler, with no word on which file was wrong.

#include "runtime/base/error.hpp"

#include <functional>
#include <map>
#include <optional>
#include <string>

namespace grace {

struct tls_files {
  std::string cert;  ///< PEM certificate chain this process presents
  std::string key;   ///< its PEM private key, unencrypted, mode 600
  std::string ca;    ///< PEM CA certificate(s) every peer must be signed by
  bool any() const { return !cert.empty() || !key.empty() || !ca.empty(); }
};

/// Each file given as a flag, else GRACE_TLS_CERT / GRACE_TLS_KEY /
/// GRACE_TLS_CA from `env` (a getenv; may return null).
tls_files tls_files_from(tls_files flags, const std::function<const char*(const char*)>& env);

/// Nothing, or all three: each a readable regular file; the key unencrypted,
/// not readable or writable by group or others, and the certificate's key;
/// the certificate valid now and signed by the CA. `origin` prefixes the
/// option names in errors ("--tls-" for flags, "GRACE_TLS_" for workers).
status check_tls_files(const tls_files& f, const std::string& origin = "--tls-");

/// What a launcher hands its workers: the three files as absolute paths
/// under GRACE_TLS_* (nothing when TLS is off).
std::map<std::string, std::string> tls_environment(const tls_files& f);

/// The warning printed when the coordination service listens on `ip`
/// without TLS and `ip` is not a loopback address; nothing otherwise.
std::optional<std::string> plaintext_warning(const std::string& ip, bool tls);

}  // namespace grace
