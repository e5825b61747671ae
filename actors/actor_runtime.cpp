#include "actors/actor_runtime.hpp"

#include "actors/caf_types.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/atom.hpp>
#include <caf/io/middleman.hpp>
#include <caf/openssl/manager.hpp>
#include <dlfcn.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include <cstdio>
#include <cstdlib>

// CAF 0.17's OpenSSL module calls SSL_get_error after SSL_read, SSL_write,
// SSL_accept and SSL_connect without emptying the thread's OpenSSL error
// queue first, which OpenSSL requires. One failed handshake (a client with
// no or a foreign certificate) leaves an error in the multiplexer thread's
// queue; the next SSL_read on any other connection that would merely block
// then reads as a fatal error, and every member's connection is closed (the
// job restarts). These definitions take precedence over libssl's for
// libcaf_openssl (the executable's symbols come first in the lookup order),
// empty the queue and call libssl's. tests/integration/tls.sh shows the
// failure without them.
namespace {
template <class F>
F next_ssl_symbol(const char* name) {
  void* f = ::dlsym(RTLD_NEXT, name);
  if (!f) {
    std::fprintf(stderr, "grace: cannot find libssl's %s: %s\n", name, ::dlerror());
    std::abort();
  }
  return reinterpret_cast<F>(f);
}
}  // namespace

extern "C" {
int SSL_read(SSL* s, void* buf, int num) {
  static auto real = next_ssl_symbol<int (*)(SSL*, void*, int)>("SSL_read");
  ERR_clear_error();
  return real(s, buf, num);
}
int SSL_write(SSL* s, const void* buf, int num) {
  static auto real = next_ssl_symbol<int (*)(SSL*, const void*, int)>("SSL_write");
  ERR_clear_error();
  return real(s, buf, num);
}
int SSL_accept(SSL* s) {
  static auto real = next_ssl_symbol<int (*)(SSL*)>("SSL_accept");
  ERR_clear_error();
  return real(s);
}
int SSL_connect(SSL* s) {
  static auto real = next_ssl_symbol<int (*)(SSL*)>("SSL_connect");
  ERR_clear_error();
  return real(s);
}
}

namespace grace {

void register_message_types(caf::actor_system_config& cfg) {
#define GRACE_REGISTER(T) cfg.add_message_type<msg<proto::T>>(wire_name<proto::T>::value);
  GRACE_MESSAGE_TYPES(GRACE_REGISTER)
#undef GRACE_REGISTER
}

actor_runtime::actor_runtime(const system_options& opts) : cfg_(std::make_unique<caf::actor_system_config>()) {
  auto& cfg = *cfg_;
  cfg.load<caf::io::middleman>();
  register_message_types(cfg);
  cfg.set("scheduler.max-threads", opts.scheduler_threads);
  if (opts.sharing_scheduler) cfg.set("scheduler.policy", caf::atom("sharing"));
  cfg.set("middleman.heartbeat-interval", caf::timespan{opts.middleman_heartbeat});
  cfg.set("middleman.connection-timeout", caf::timespan{opts.connection_timeout});
  cfg.set("middleman.workers", opts.middleman_workers);
  if (opts.tls.any()) {
    cfg.openssl_certificate = opts.tls.cert;
    cfg.openssl_key = opts.tls.key;
    cfg.openssl_cafile = opts.tls.ca;
    cfg.load<caf::openssl::manager>();
  }
  sys_ = std::make_unique<caf::actor_system>(cfg);
}

actor_runtime::~actor_runtime() {
  sys_.reset();
  cfg_.reset();
}

}  // namespace grace
