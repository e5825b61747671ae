#pragma once
/// Who may join the coordination service: every check a Join passes before
/// it becomes a member, as a pure rule (the coordinator actor decodes the
/// message, asks `admit`, and carries the verdict out). The agreement's own
/// check comes after these (agreement::join_refusal: a member whose step
/// would break the group's level).
///
/// Checks, in order (the first that fails decides):
///   protocol version, the job's secret            -> refuse
///   elastic job: this incarnation, its group formed,
///                its world size                   -> refuse for now
///   world size, rank in range, run id             -> refuse
///   a rejoin (the service moved): only while this
///     service takes over that incarnation, once
///     per rank                                    -> refuse for now
///   the first join of incarnation current + 1 once
///     the old group is gone                       -> advance (then ask again)
///   another incarnation; a rank already joined or
///     left in this one                            -> refuse for now
///   node-local vs shared directories, sharded vs
///     replicated state, unlike the members'       -> refuse
/// "Refuse" ends the worker (a configuration error); "refuse for now" makes
/// it exit with the restart code, and its launcher restarts it in the
/// incarnation the refusal names.

#include <cstdint>
#include <functional>
#include <string>

namespace grace {

/// A Join, as the rules read it.
struct join_request {
  uint32_t protocol_version = 0;
  std::string token;
  std::string run_id;
  uint32_t rank = 0;
  uint32_t world_size = 0;
  uint32_t incarnation = 0;
  bool rejoin = false;      ///< a survivor rejoining a successor service
  uint32_t node_local = 0;  ///< node-local checkpoint directories: ranks per node (0: shared)
  bool sharded = false;     ///< it registered sharded state
};

/// What the service holds when a Join arrives.
struct admission_state {
  uint32_t protocol_version = 0;  ///< this service's
  std::string token;              ///< the job's secret
  std::string run_id;
  uint32_t world_size = 0;  ///< the job's (elastic: the current group's)
  uint32_t incarnation = 0;
  bool elastic = false;
  bool group_formed = false;  ///< elastic: the current incarnation's group is decided
  bool takeover = false;      ///< survivors of a predecessor service may rejoin
  bool has_members = false;   ///< someone joined in this incarnation
  bool group_gone = false;    ///< no member of this incarnation is live any more
  uint32_t node_local = 0;    ///< the members' layout, as join_request (read when has_members)
  bool sharded = false;       ///< the members' state (read when has_members)
  std::function<bool(uint32_t)> joined;  ///< rank is a member of this incarnation
  std::function<bool(uint32_t)> left;    ///< rank left this incarnation
  std::function<bool(uint32_t)> lost;    ///< rank was declared lost in this incarnation
};

struct admission {
  enum class verdict {
    admit,           ///< passes (the agreement's check comes next)
    refuse,          ///< a configuration error: the worker ends
    refuse_for_now,  ///< restart into the incarnation the refusal names
    advance,         ///< start incarnation + 1 (the first join of the next group), then ask again
  };
  verdict what = verdict::admit;
  std::string reason;
};

admission admit(const join_request& j, const admission_state& s);

}  // namespace grace
