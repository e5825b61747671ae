#pragma once
/// The coordination service a worker talks to, shared by its actors (peer
/// watcher, checkpoint writer) and its trainer thread. Swapped by the peer
/// watcher when the service moves (etcd failover: a successor was elected
/// after the host of the old one was lost); everyone else reads it for each
/// message, so nothing keeps talking to the old one.

#include "actors/coordinator.hpp"

#include <mutex>

namespace grace {

class coordinator_ref {
public:
  explicit coordinator_ref(coordinator_actor h = {}) : h_(std::move(h)) {}
  coordinator_actor get() const {
    std::lock_guard<std::mutex> g(m_);
    return h_;
  }
  void set(coordinator_actor h) {
    std::lock_guard<std::mutex> g(m_);
    h_ = std::move(h);
  }

private:
  mutable std::mutex m_;
  coordinator_actor h_;
};

}  // namespace grace
