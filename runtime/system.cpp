#include "runtime/system.hpp"

#include "messages/caf_types.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/atom.hpp>
#include <caf/io/middleman.hpp>

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
  sys_ = std::make_unique<caf::actor_system>(cfg);
}

actor_runtime::~actor_runtime() {
  sys_.reset();
  cfg_.reset();
}

}  // namespace grace
