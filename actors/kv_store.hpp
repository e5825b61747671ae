#pragma once
/// A `gloo::rendezvous::Store` (and the NCCL id exchange) backed by the
/// coordination service's key-value store. Keys are set-once and never
/// deleted: callers use a fresh prefix per rendezvous (run id + incarnation).

#include "actors/coordinator.hpp"

#include <gloo/rendezvous/store.h>

#include <chrono>

namespace grace {

class coordinator_store : public gloo::rendezvous::Store {
public:
  coordinator_store(caf::actor_system& sys, coordinator_member coord,
                    std::chrono::milliseconds timeout = std::chrono::seconds(30));
  void set(const std::string& key, const std::vector<char>& data) override;
  /// Blocks until the key exists (Gloo's connectFullMesh relies on it).
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

private:
  caf::actor_system& sys_;
  coordinator_member coord_;
  std::chrono::milliseconds timeout_;
};

}  // namespace grace
