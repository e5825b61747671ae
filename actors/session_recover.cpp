// Recovery in place on the worker's side (runtime/coordination/agreement.hpp,
// "Recovery in place"): serve the state as the donor, take it from the
// donor, form the collectives again, report (session_parts.hpp).
#include "actors/session_parts.hpp"

namespace grace {

bool session::impl::can_recover_in_place() const {
  const char* mode = std::getenv("GRACE_RECOVERY");
  if (!mode || std::string(mode) != "in-place" || !reg.world_change || reg.sharded || cluster.world_size < 2 ||
      cluster.local_mode())
    return false;
  for (auto& t : reg.tensors)
    if (t.memory != memory_kind::host) return false;
  return true;
}

void session::impl::start_state_server() {
  if (!can_recover_in_place()) return;
  auto s = state_server::start(cluster.host, cluster.token, opts.connect_timeout);
  if (!s) {
    log->warn("recovery in place off for this worker: {}", s.err().message);
    return;
  }
  member.donor = std::move(s.value());
}

namespace {

/// The counters and blobs a donor sends with its tensors.
rank_state donor_meta(const session_registry& reg) {
  rank_state m;
  for (auto& [name, p] : reg.counters) m.counters[name] = *p;
  for (auto& [name, h] : reg.blobs) m.metadata["grace.blob." + name] = base64_encode(h.save());
  return m;
}

/// The donor's counters and blobs into the registered ones.
status apply_meta(const session_registry& reg, const rank_state& m) {
  for (auto& [name, p] : reg.counters) {
    auto it = m.counters.find(name);
    if (it == m.counters.end()) return error{errc::invalid_input, "the donor has no counter '" + name + "'"};
    *p = it->second;
  }
  for (auto& [name, h] : reg.blobs) {
    auto it = m.metadata.find("grace.blob." + name);
    auto bytes = it == m.metadata.end() ? std::nullopt : base64_decode(it->second);
    if (!bytes) return error{errc::invalid_input, "the donor sent no valid blob '" + name + "'"};
    try {
      h.restore(*bytes);
    } catch (const std::exception& e) {
      return error{errc::invalid_input, "restoring blob '" + name + "' from the donor failed: " + e.what()};
    }
  }
  return {};
}

}  // namespace

status session::impl::recover_in_place(const worker_decision& d, bool& torn) {
  const auto t0 = mono_ns();
  auto s = wire.ctl->take_snapshot();
  if (!s.recover || s.recover->id != d.id) return error{errc::failed, "recovery order gone"};
  const recover_order o = *s.recover;
  // The old communicator is never called again; the trainer replaces it.
  disarm_abort();
  // Until the collectives are formed again the watcher answers nothing for
  // this trainer (its state may be torn while the bytes come in).
  wire.ctl->started.store(o.step + 1, std::memory_order_seq_cst);
  uint64_t fetched = 0;
  const bool donor = o.donor == cluster.rank;
  if (donor) {
    if (member.donor) member.donor->arm({o.id, o.step, reg.tensors, donor_meta(reg)});
  } else if (completed != o.step || member.replacement) {
    log->info("recovery in place #{}: taking step {} from rank {} ({})", o.id, o.step, o.donor, o.donor_endpoint);
    auto got = fetch_state(o.donor_endpoint, cluster.token, o.id, o.step, reg.tensors, opts.connect_timeout);
    if (got) {
      auto st = apply_meta(reg, got->meta);
      if (!st) got = st.err();
    }
    if (!got) {
      torn = true;
      return got.err();
    }
    fetched = got->bytes;
    completed = o.step;
    wire.ctl->completed.store(o.step, std::memory_order_seq_cst);
  }
  const auto fetched_ns = mono_ns() - t0;
  member.prefix = o.prefix;
  member.replacement = false;
  member.policy->recovered();
  wire.ctl->end_recovery(o.id);
  auto st = reg.world_change();
  if (donor && member.donor) member.donor->disarm();  // every peer formed its collectives: each has the state
  if (!st) return error{st.err().code, "forming the collectives again failed: " + st.err().message};
  ++member.recoveries;
  to_coordinator(make<proto::Recovered>([&](auto b) {
    b.setAgreementId(o.id);
    b.setRank(cluster.rank);
  }));
  const auto ns = mono_ns() - t0;
  log->info("recovered in place (#{}): at step {}{}, collectives formed again in {:.1f} ms", o.id, o.step,
            donor ? " as the donor" : fetched ? fmt::format(", {:.1f} MiB taken from rank {}", fetched / 1048576.0, o.donor) : "",
            ns / 1e6);
  emit_event("recovered", {{"id", o.id}, {"step", o.step}, {"donor", o.donor}, {"bytes", fetched},
                           {"fetch_ns", fetched_ns}, {"ns", ns}});
  return {};
}

status session::impl::await_recovery() {
  log->info("replacement for rank {}: waiting for the group's recovery order", cluster.rank);
  if (auto s = boundary(completed + 1, boundary_mode::step_start, {}, false))
    return error{errc::preempted, "replacement for rank " + std::to_string(cluster.rank) + ": " + reason};
  if (member.recoveries == 0)
    return error{errc::preempted, "replacement for rank " + std::to_string(cluster.rank) + " was not recovered"};
  return {};
}

}  // namespace grace
