#include "runtime/net/tls.hpp"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>

namespace grace {

namespace {

/// "--tls-" + "cert" -> "--tls-cert"; "GRACE_TLS_" + "cert" -> "GRACE_TLS_CERT".
std::string option(const std::string& origin, std::string what) {
  if (!origin.empty() && origin.back() == '_')
    for (auto& c : what) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return origin + what;
}

/// The newest OpenSSL error as text (and the queue emptied).
std::string ssl_reason() {
  unsigned long e = ERR_get_error();
  std::string out;
  if (e) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    out = std::string(": ") + buf;
  }
  ERR_clear_error();
  return out;
}

status readable_file(const std::string& name, const std::string& path) {
  struct stat sb {};
  if (::stat(path.c_str(), &sb) != 0) return invalid_input(name + " " + path + ": " + std::strerror(errno));
  if (!S_ISREG(sb.st_mode)) return invalid_input(name + " " + path + " is not a regular file");
  return {};
}

using bio_ptr = std::unique_ptr<BIO, decltype(&BIO_free)>;
using x509_ptr = std::unique_ptr<X509, decltype(&X509_free)>;
using pkey_ptr = std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)>;
using store_ptr = std::unique_ptr<X509_STORE, decltype(&X509_STORE_free)>;
using store_ctx_ptr = std::unique_ptr<X509_STORE_CTX, decltype(&X509_STORE_CTX_free)>;
using chain_ptr = std::unique_ptr<STACK_OF(X509), void (*)(STACK_OF(X509)*)>;

bio_ptr open_bio(const std::string& path) { return {BIO_new_file(path.c_str(), "r"), &BIO_free}; }

/// A passphrase callback that never prompts: an encrypted key is an error,
/// not a question on a terminal a launcher may not have.
int no_passphrase(char*, int, int, void*) { return -1; }

/// The certificate file: the leaf first, then any intermediates.
result<std::pair<x509_ptr, chain_ptr>> read_chain(const std::string& name, const std::string& path) {
  auto bio = open_bio(path);
  if (!bio) return invalid_input(name + " " + path + ": cannot open it" + ssl_reason());
  x509_ptr leaf{PEM_read_bio_X509(bio.get(), nullptr, no_passphrase, nullptr), &X509_free};
  if (!leaf) return invalid_input(name + " " + path + " holds no PEM certificate" + ssl_reason());
  chain_ptr rest{sk_X509_new_null(), [](STACK_OF(X509)* s) { sk_X509_pop_free(s, X509_free); }};
  while (X509* c = PEM_read_bio_X509(bio.get(), nullptr, no_passphrase, nullptr)) sk_X509_push(rest.get(), c);
  ERR_clear_error();  // the end of the file reads as an error
  return std::make_pair(std::move(leaf), std::move(rest));
}

result<pkey_ptr> read_key(const std::string& name, const std::string& path) {
  struct stat sb {};
  ::stat(path.c_str(), &sb);
  if (sb.st_mode & (S_IRWXG | S_IRWXO))
    return invalid_input(name + " " + path + " can be read or written by group or others (chmod 600 " + path + ")");
  auto bio = open_bio(path);
  if (!bio) return invalid_input(name + " " + path + ": cannot open it" + ssl_reason());
  pkey_ptr key{PEM_read_bio_PrivateKey(bio.get(), nullptr, no_passphrase, nullptr), &EVP_PKEY_free};
  if (!key)
    return invalid_input(name + " " + path + " is not an unencrypted PEM private key (an encrypted one: " +
               "openssl pkey -in KEY -out KEY.plain)" + ssl_reason());
  return key;
}

/// Verifies `leaf` under the CA file for one TLS role: every process is
/// both a server (the coordination service, a member's own endpoint) and a
/// client, so the certificate must allow both.
status verify_for(X509_STORE* store, X509* leaf, STACK_OF(X509) * chain, int purpose, const std::string& what) {
  store_ctx_ptr ctx{X509_STORE_CTX_new(), &X509_STORE_CTX_free};
  if (!ctx || X509_STORE_CTX_init(ctx.get(), store, leaf, chain) != 1)
    return error{errc::failed, "cannot set up certificate verification" + ssl_reason()};
  X509_STORE_CTX_set_purpose(ctx.get(), purpose);
  if (X509_verify_cert(ctx.get()) == 1) return {};
  ERR_clear_error();
  return invalid_input(what + X509_verify_cert_error_string(X509_STORE_CTX_get_error(ctx.get())));
}

status verify_certificate(const tls_files& f, const std::string& origin, X509* leaf, STACK_OF(X509) * chain) {
  auto ca_name = option(origin, "ca") + " " + f.ca;
  store_ptr store{X509_STORE_new(), &X509_STORE_free};
  if (!store) return error{errc::failed, "cannot allocate a certificate store" + ssl_reason()};
  if (X509_STORE_load_file(store.get(), f.ca.c_str()) != 1)
    return invalid_input(ca_name + " holds no PEM CA certificate" + ssl_reason());
  auto what = option(origin, "cert") + " " + f.cert + " is not valid under " + ca_name + ": ";
  if (auto st = verify_for(store.get(), leaf, chain, X509_PURPOSE_SSL_SERVER, what); !st) return st;
  if (auto st = verify_for(store.get(), leaf, chain, X509_PURPOSE_SSL_CLIENT, what); !st)
    return invalid_input(st.err().message + " (Grace's TLS is mutual: the certificate must allow TLS client use too, " +
               "extendedKeyUsage serverAuth,clientAuth or none)");
  return {};
}

}  // namespace

tls_files tls_files_from(tls_files flags, const std::function<const char*(const char*)>& env) {
  auto fill = [&](std::string& v, const char* var) {
    if (v.empty())
      if (const char* e = env(var)) v = e;
  };
  fill(flags.cert, "GRACE_TLS_CERT");
  fill(flags.key, "GRACE_TLS_KEY");
  fill(flags.ca, "GRACE_TLS_CA");
  return flags;
}

status check_tls_files(const tls_files& f, const std::string& origin) {
  if (!f.any()) return {};
  std::string missing;
  for (auto [v, n] : {std::pair{&f.cert, "cert"}, {&f.key, "key"}, {&f.ca, "ca"}})
    if (v->empty()) missing += (missing.empty() ? "" : ", ") + option(origin, n);
  if (!missing.empty())
    return invalid_input("TLS needs " + option(origin, "cert") + ", " + option(origin, "key") + " and " + option(origin, "ca") +
               " together; missing: " + missing);
  for (auto [v, n] : {std::pair{&f.cert, "cert"}, {&f.key, "key"}, {&f.ca, "ca"}})
    if (auto st = readable_file(option(origin, n), *v); !st) return st;
  auto chain = read_chain(option(origin, "cert"), f.cert);
  if (!chain) return chain.err();
  auto key = read_key(option(origin, "key"), f.key);
  if (!key) return key.err();
  if (X509_check_private_key(chain->first.get(), key->get()) != 1) {
    ERR_clear_error();
    return invalid_input(option(origin, "key") + " " + f.key + " is not the private key of " + option(origin, "cert") + " " +
               f.cert);
  }
  return verify_certificate(f, origin, chain->first.get(), chain->second.get());
}

std::map<std::string, std::string> tls_environment(const tls_files& f) {
  if (!f.any()) return {};
  auto abs = [](const std::string& p) { return std::filesystem::absolute(p).lexically_normal().string(); };
  return {{"GRACE_TLS_CERT", abs(f.cert)}, {"GRACE_TLS_KEY", abs(f.key)}, {"GRACE_TLS_CA", abs(f.ca)}};
}

std::optional<std::string> plaintext_warning(const std::string& ip, bool tls) {
  if (tls || ip.rfind("127.", 0) == 0) return std::nullopt;
  return "warning: the coordination service listens on " + ip +
         " without TLS: anyone on that network can read the job's secret from a member's join, then join, "
         "forge a cluster error or stop every worker; give --tls-cert, --tls-key and --tls-ca "
         "(docs/SECURITY.md)";
}

}  // namespace grace
