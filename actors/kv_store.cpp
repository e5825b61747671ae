#include "actors/kv_store.hpp"

#include <caf/actor_system.hpp>
#include <caf/scoped_actor.hpp>

#include <gloo/common/error.h>

namespace grace {

coordinator_store::coordinator_store(caf::actor_system& sys, coordinator_member coord, std::chrono::milliseconds timeout)
    : sys_(sys), coord_(std::move(coord)), timeout_(timeout) {}

namespace {
template <class Request>
msg<proto::KvReply> ask(caf::actor_system& sys, const coordinator_member& coord, Request request,
                        std::chrono::milliseconds timeout) {
  caf::scoped_actor self{sys};
  msg<proto::KvReply> out;
  std::string failure;
  self->request(coord, timeout + std::chrono::seconds(2), std::move(request))
      .receive([&](msg<proto::KvReply>& r) { out = std::move(r); }, [&](caf::error& e) { failure = sys.render(e); });
  if (!failure.empty()) throw gloo::IoException("coordination store: " + failure);
  return out;
}
}  // namespace

void coordinator_store::set(const std::string& key, const std::vector<char>& data) {
  auto m = make<proto::KvSet>([&](auto b) {
    b.setKey(key);
    b.setValue(capnp::Data::Reader(reinterpret_cast<const uint8_t*>(data.data()), data.size()));
  });
  auto rep = ask(sys_, coord_, std::move(m), timeout_);
  auto r = decode(rep);
  if (!r) throw gloo::IoException("coordination store: " + r.err().message);
  if (!r->get().getOk()) throw gloo::IoException("coordination store set: " + str(r->get().getError()));
}

std::vector<char> coordinator_store::get(const std::string& key) {
  auto m = make<proto::KvGet>([&](auto b) {
    b.setKey(key);
    b.setTimeoutMs(static_cast<uint32_t>(timeout_.count()));
  });
  auto rep = ask(sys_, coord_, std::move(m), timeout_);
  auto r = decode(rep);
  if (!r) throw gloo::IoException("coordination store: " + r.err().message);
  if (!r->get().getOk()) throw gloo::IoException("coordination store get: " + str(r->get().getError()));
  auto v = r->get().getValue();
  return std::vector<char>(v.begin(), v.end());
}

void coordinator_store::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void coordinator_store::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  // One deadline for all keys (as Gloo's FileStore::wait): waiting for N
  // keys must not take N times the timeout.
  using clock = std::chrono::steady_clock;
  const auto deadline = clock::now() + timeout;
  for (auto& k : keys) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now());
    if (left.count() <= 0)
      throw gloo::IoException("coordination store wait: timeout after " + std::to_string(timeout.count()) +
                              " ms waiting for key " + k);
    auto m = make<proto::KvGet>([&](auto b) {
      b.setKey(k);
      b.setTimeoutMs(static_cast<uint32_t>(left.count()));
    });
    auto rep = ask(sys_, coord_, std::move(m), left);
    auto r = decode(rep);
    if (!r || !r->get().getOk())
      throw gloo::IoException("coordination store wait: " + (r ? str(r->get().getError()) : r.err().message));
  }
}

}  // namespace grace
