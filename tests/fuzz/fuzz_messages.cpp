// libFuzzer: every protocol message's decoder (messages/wire.hpp) on
// arbitrary bytes. Each decoder checks the frame's type id first, so one
// input is tried against all of them. A decoded message must be safe to
// read in full: decode() promises later field reads cannot fail.
#include "messages/wire.hpp"

#include <cstddef>
#include <cstdint>

namespace {

template <class S>
void try_decode(const std::vector<uint8_t>& bytes) {
  grace::msg<S> m{bytes};
  auto r = grace::decode(m);
  if (r) (void)r->get().totalSize();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace p = grace::proto;
  std::vector<uint8_t> bytes(data, data + size);
  try_decode<p::Join>(bytes);
  try_decode<p::Welcome>(bytes);
  try_decode<p::Heartbeat>(bytes);
  try_decode<p::PeerLost>(bytes);
  try_decode<p::Leave>(bytes);
  try_decode<p::Notice>(bytes);
  try_decode<p::Claim>(bytes);
  try_decode<p::ClaimReply>(bytes);
  try_decode<p::CheckpointAt>(bytes);
  try_decode<p::Ack>(bytes);
  try_decode<p::CheckpointSaved>(bytes);
  try_decode<p::ProposeFinal>(bytes);
  try_decode<p::DeadlineUpdate>(bytes);
  try_decode<p::Committed>(bytes);
  try_decode<p::ErrorReport>(bytes);
  try_decode<p::ClusterError>(bytes);
  try_decode<p::Shutdown>(bytes);
  try_decode<p::KvSet>(bytes);
  try_decode<p::KvGet>(bytes);
  try_decode<p::KvReply>(bytes);
  try_decode<p::Barrier>(bytes);
  try_decode<p::BarrierReply>(bytes);
  try_decode<p::HeartbeatBatch>(bytes);
  try_decode<p::AckBatch>(bytes);
  try_decode<p::CommitParts>(bytes);
  try_decode<p::CommitCheck>(bytes);
  try_decode<p::CommitCheckReply>(bytes);
  try_decode<p::GroupPlanRequest>(bytes);
  try_decode<p::GroupPlan>(bytes);
  return 0;
}
