#include "runtime/coordination/admission.hpp"

#include "runtime/net/job_token.hpp"

namespace grace {

namespace {

using v = admission::verdict;

admission refuse(std::string why) { return {v::refuse, std::move(why)}; }
admission for_now(std::string why) { return {v::refuse_for_now, std::move(why)}; }
std::string num(uint64_t n) { return std::to_string(n); }

admission elastic_check(const join_request& j, const admission_state& s) {
  const auto inc = num(s.incarnation);
  if (j.incarnation != s.incarnation) return for_now("incarnation " + num(j.incarnation) + " != current " + inc);
  if (!s.group_formed) return for_now("the group of incarnation " + inc + " is not formed yet");
  if (j.world_size != s.world_size)
    return for_now("world size " + num(j.world_size) + " != the " + num(s.world_size) + " of incarnation " + inc +
                   "'s group");
  return {};
}

admission rejoin_check(const join_request& j, const admission_state& s) {
  const auto inc = num(j.incarnation);
  if (!s.takeover || j.incarnation != s.incarnation)
    return for_now("no takeover of incarnation " + inc + " here (current " + num(s.incarnation) + ", takeover " +
                   (s.takeover ? "open" : "closed") + ")");
  if (s.joined(j.rank) || s.lost(j.rank))
    return for_now("rank " + num(j.rank) + " already rejoined or lost in incarnation " + inc);
  return {};
}

admission layout_check(const join_request& j, const admission_state& s) {
  if (!s.has_members) return {};
  const auto rank = num(j.rank);
  if (j.node_local != s.node_local)
    return refuse("rank " + rank + " has " +
                  (j.node_local ? "node-local checkpoint directories" : "a shared checkpoint directory") +
                  ", the members joined before " + (s.node_local ? "node-local ones" : "a shared one") +
                  ": every member of a job must see the same layout");
  if (j.sharded != s.sharded)
    return refuse("rank " + rank + (j.sharded ? " holds" : " does not hold") + " sharded state, the members joined before " +
                  (j.sharded ? "do not" : "do") + ": every member of a job must register the same tensors");
  return {};
}

}  // namespace

admission admit(const join_request& j, const admission_state& s) {
  if (j.protocol_version != s.protocol_version)
    return refuse("protocol version " + num(j.protocol_version) + " != coordinator's " + num(s.protocol_version));
  if (!constant_time_equal(j.token, s.token)) return refuse("wrong job token");
  if (s.elastic)
    if (auto a = elastic_check(j, s); a.what != v::admit) return a;
  if (j.world_size != s.world_size)
    return refuse("world size " + num(j.world_size) + " != job's " + num(s.world_size));
  if (j.rank >= s.world_size) return refuse("rank " + num(j.rank) + " out of range");
  if (j.run_id != s.run_id) return refuse("run id '" + j.run_id + "' != job's '" + s.run_id + "'");
  if (j.rejoin) return rejoin_check(j, s);
  // Launchers on other nodes restart their groups on their own: the first
  // join of a newer incarnation, once the old group is gone, advances it.
  if (j.incarnation == s.incarnation + 1 && s.has_members && s.group_gone) return {v::advance, {}};
  if (j.incarnation != s.incarnation)
    return for_now("incarnation " + num(j.incarnation) + " != current " + num(s.incarnation));
  if (s.joined(j.rank) || s.left(j.rank))
    return for_now("duplicate rank " + num(j.rank) + " in incarnation " + num(s.incarnation));
  return layout_check(j, s);
}

}  // namespace grace
