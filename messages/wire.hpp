#pragma once
/// Copyable wire messages: Cap'n Proto bytes in a `std::vector<uint8_t>`.
///
/// `msg<S>` is what actors send (CAF 0.17 copies messages, and a byte vector
/// is copied and serialized with one memcpy). `decode()` turns bytes from any
/// source, including the network, into a typed `reader<S>` only after
/// checking the frame (magic, protocol version, schema id), the size limit
/// and every pointer in the message; anything malformed becomes an
/// `errc::invalid_input` error, never a crash.
///
/// Frame layout (16 bytes, keeps the Cap'n Proto words 8-byte aligned):
///   "GRCE" | protocol version (u32 LE) | schema type id (u64 LE) | words...

#include "messages/grace.capnp.h"
#include "runtime/base/error.hpp"

#include <capnp/message.h>
#include <capnp/schema.h>
#include <capnp/serialize.h>

#include <cstring>
#include <memory>
#include <vector>

namespace grace {

/// Largest message accepted from anywhere (the rendezvous carries small
/// values only; tensors travel through Gloo/NCCL, never through CAF).
constexpr size_t max_message_bytes = 1u << 20;
constexpr size_t frame_header_bytes = 16;

/// Every message type of the protocol, once (X-macro): registration with
/// CAF, tests and tools iterate over it.
#define GRACE_MESSAGE_TYPES(X)                                                                                     \
  X(Join)                                                                                                          \
  X(Welcome) X(Heartbeat) X(PeerLost) X(Leave) X(Notice) X(Claim) X(ClaimReply) X(CheckpointAt) X(Ack)             \
      X(CheckpointSaved) X(ProposeFinal) X(DeadlineUpdate) X(Committed) X(ErrorReport) X(ClusterError) X(Shutdown) \
          X(KvSet) X(KvGet) X(KvReply) X(Barrier) X(BarrierReply) X(HeartbeatBatch) X(AckBatch) X(CommitParts) \
              X(CommitCheck) X(CommitCheckReply) X(GroupPlanRequest) X(GroupPlan) X(LauncherRegister)          \
                  X(LauncherRegisterReply) X(WorkerExited) X(CheckpointPeers) X(CheckpointPeersReply)          \
                      X(RelayRegister) X(IncarnationQuery) X(IncarnationReply) X(ResizeQuery) X(ResizeReply)   \
                          X(OwedQuery) X(OwedReply) X(StatusQuery) X(StatusReply) X(Recover) X(Recovered)

/// A Cap'n Proto message of schema `S`, framed, as bytes.
template <class S>
struct msg {
  std::vector<uint8_t> bytes;
};

namespace detail {
std::vector<uint8_t> frame(capnp::MessageBuilder& b, uint64_t type_id);
/// Checks the frame and returns the aligned words, or an error.
result<kj::Array<capnp::word>> unframe(const std::vector<uint8_t>& bytes, uint64_t type_id, const char* type_name);
error decode_error(const char* type_name, const char* what);
/// Reads every field of a message (recursively): totalSize() checks the
/// pointers, but a Text without its terminating NUL only throws when read,
/// which must happen here and not in an actor's handler. Throws kj::Exception.
void read_every_field(capnp::AnyStruct::Reader root, capnp::StructSchema schema);
}  // namespace detail

/// Builds a message: `auto m = make<proto::Ack>([&](auto b) { b.setRank(1); });`
template <class S, class F>
msg<S> make(F&& fill) {
  capnp::MallocMessageBuilder b(256);
  fill(b.initRoot<S>());
  return msg<S>{detail::frame(b, capnp::typeId<S>())};
}

/// A copy of message `from` with `change` applied: every field is carried,
/// so a field added to the schema later is never dropped on the way.
template <class S, class F>
msg<S> edited(typename S::Reader from, F&& change) {
  capnp::MallocMessageBuilder b(256);
  b.setRoot(from);
  change(b.getRoot<S>());
  return msg<S>{detail::frame(b, capnp::typeId<S>())};
}

/// A decoded, validated message. Owns its words; cheap to move.
template <class S>
class reader {
public:
  typename S::Reader get() const { return root_; }
  const typename S::Reader* operator->() const { return &root_; }
  reader(kj::Array<capnp::word> words)
      : words_(kj::mv(words)),
        reader_(std::make_unique<capnp::FlatArrayMessageReader>(words_.asPtr(), options())),
        root_(reader_->getRoot<S>()) {}
  static capnp::ReaderOptions options() {
    capnp::ReaderOptions o;
    o.traversalLimitInWords = max_message_bytes / sizeof(capnp::word);
    o.nestingLimit = 16;
    return o;
  }

private:
  kj::Array<capnp::word> words_;
  std::unique_ptr<capnp::FlatArrayMessageReader> reader_;
  typename S::Reader root_;
};

/// Validates and decodes. Every pointer and every text is checked up front
/// (totalSize() walks the pointers, read_every_field the values), so later
/// field reads cannot fail.
template <class S>
result<reader<S>> decode(const msg<S>& m) {
  const char* name = capnp::Schema::from<S>().getShortDisplayName().cStr();
  auto words = detail::unframe(m.bytes, capnp::typeId<S>(), name);
  if (!words) return words.err();
  try {
    reader<S> r(kj::mv(words.value()));
    r.get().totalSize();
    detail::read_every_field(capnp::AnyStruct::Reader(r.get()), capnp::Schema::from<S>());
    return r;
  } catch (const kj::Exception& e) {
    return detail::decode_error(name, e.getDescription().cStr());
  }
}

/// Copies a Cap'n Proto Text into a std::string.
inline std::string str(capnp::Text::Reader t) { return std::string(t.cStr(), t.size()); }
/// Copies a Cap'n Proto Data into bytes.
inline std::vector<uint8_t> bytes(capnp::Data::Reader d) { return {d.begin(), d.end()}; }
/// A Cap'n Proto Data view of bytes (no copy).
inline capnp::Data::Reader as_data(const std::vector<uint8_t>& v) { return {v.data(), v.size()}; }

}  // namespace grace
