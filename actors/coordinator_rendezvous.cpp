/// Keys and barriers of the collectives' rendezvous, served to the members
/// of the current incarnation (runtime/coordination/rendezvous_table.hpp).
#include "actors/coordinator_parts.hpp"
#include "actors/convert.hpp"

#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

namespace grace::coord {

msg<proto::KvReply> kv_reply(bool ok, const std::vector<uint8_t>* value, const std::string& err) {
  return make<proto::KvReply>([&](auto b) {
    b.setOk(ok);
    if (value) b.setValue(as_data(*value));
    b.setError(err);
  });
}

msg<proto::BarrierReply> barrier_reply(bool ok, const std::string& err) {
  return make<proto::BarrierReply>([&](auto b) {
    b.setOk(ok);
    b.setError(err);
  });
}

/// Answers table waiters (gets and barriers) by their ids.
void deliver(coordinator_ptr self, const std::vector<rendezvous_table::reply>& replies) {
  if (!replies.empty() && fenced(self)) return;
  auto& st = self->state;
  for (auto& r : replies) {
    if (auto it = st.kv.get_waiters.find(r.waiter); it != st.kv.get_waiters.end()) {
      it->second.deliver(kv_reply(r.ok, r.ok ? &r.value : nullptr, r.error));
      st.kv.get_waiters.erase(it);
    } else if (auto bt = st.kv.barrier_waiters.find(r.waiter); bt != st.kv.barrier_waiters.end()) {
      bt->second.deliver(barrier_reply(r.ok, r.error));
      st.kv.barrier_waiters.erase(bt);
    }
  }
}

/// A lost member breaks this incarnation's group: rendezvous keys and
/// barriers still pending can never complete, so they fail now rather than
/// at their timeouts (the members then wait for the just-in-time round).
void fail_pending(coordinator_ptr self, const std::string& why) { deliver(self, self->state.kv.table.break_group(why)); }

msg<proto::KvReply> on_kv_set(coordinator_ptr self, msg<proto::KvSet>& m) {
  if (!from_member_process(self, "a key-value set")) return kv_reply(false, nullptr, "refused: not a member");
  auto r = decode(m);
  if (!r) return kv_reply(false, nullptr, r.err().message);
  auto res = self->state.kv.table.set(str(r->get().getKey()), bytes(r->get().getValue()));
  deliver(self, res.woken);
  return kv_reply(res.ok, nullptr, res.error);
}

/// Answered at once (found, or failed), or when the key is set, the group
/// breaks or the get's own timeout passes.
caf::result<msg<proto::KvReply>> on_kv_get(coordinator_ptr self, msg<proto::KvGet>& m) {
  auto& st = self->state;
  if (!from_member_process(self, "a key-value get")) return kv_reply(false, nullptr, "refused: not a member");
  auto r = decode(m);
  if (!r) return kv_reply(false, nullptr, r.err().message);
  auto timeout = r->get().getTimeoutMs();
  auto id = st.kv.next_waiter++;
  auto res = st.kv.table.get(str(r->get().getKey()), id, timeout > 0);
  using ty = rendezvous_table::get_result::type;
  if (res.what == ty::found) return kv_reply(true, &res.value, "");
  if (res.what == ty::failed) return kv_reply(false, nullptr, res.error);
  auto rp = self->make_response_promise<msg<proto::KvReply>>();
  st.kv.get_waiters.emplace(id, rp);
  self->delayed_send(self, std::chrono::milliseconds(timeout), kv_timeout_atom::value, id);
  return rp;
}

caf::result<msg<proto::BarrierReply>> on_barrier(coordinator_ptr self, msg<proto::Barrier>& m) {
  auto& st = self->state;
  auto r = decode(m);
  if (!r) return barrier_reply(false, r.err().message);
  if (!from_member(self, r->get().getRank(), "a barrier")) return barrier_reply(false, "refused: not that member");
  auto id = st.kv.next_waiter++;
  auto res = st.kv.table.arrive(str(r->get().getName()), r->get().getRank(), r->get().getCount(), id);
  if (!res.pending) return barrier_reply(res.ok, res.error);
  auto rp = self->make_response_promise<msg<proto::BarrierReply>>();
  st.kv.barrier_waiters.emplace(id, rp);
  deliver(self, res.released);  // may include this arrival (the last one)
  return rp;
}

}  // namespace grace::coord
