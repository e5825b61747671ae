// attach(): restore, start the worker's actors, join the group (session_parts.hpp).
#include "actors/session_parts.hpp"

namespace grace {

status session::impl::restore_blobs(const restored_checkpoint& r, const rank_state& own) {
  for (auto& [name, h] : reg.blobs) {
    auto it = own.metadata.find(blob_key(name));
    if (it == own.metadata.end())
      return error{errc::invalid_input, r.path.string() + " has no blob '" + name +
                                            "': it was written by a trainer that did not register it"};
    auto bytes = base64_decode(it->second);
    if (!bytes)
      return error{errc::invalid_input, "blob '" + name + "' in " + r.path.string() + " is not valid base64"};
    try {
      h.restore(*bytes);
    } catch (const std::exception& e) {
      return error{errc::invalid_input,
                   "restoring blob '" + name + "' from " + r.path.string() + " failed: " + e.what()};
    }
  }
  return {};
}

uint32_t session::impl::node_local_world() const {
  return reg.sharded && cluster.node_local_checkpoints && cluster.world_size > 1 ? local_world_size() : 0;
}

bool session::impl::dir_keeper() const {
  const auto lw = node_local_world();
  return lw ? cluster.rank % lw == 0 : cluster.is_chief();
}

status session::impl::check_shared_dir() {
  if (!reg.sharded || cluster.world_size < 2 || !member.kv || opts.checkpoint_dir.empty()) return {};
  shared_dir_probe p;
  p.dir = opts.checkpoint_dir;
  p.rank = cluster.rank;
  p.world = cluster.world_size;
  p.incarnation = cluster.incarnation;
  p.local_world = local_world_size();
  p.prefix = member.prefix;
  p.timeout = opts.wait_timeout;
  p.node_local = node_local_world() > 0;
  auto st = p.node_local ? check_node_local_directories(p, *member.kv) : check_shared_directory(p, *member.kv);
  if (!st) log->error("{}", st.err().message);
  return st;
}

status session::impl::start_replicas() {
  if (!reg.sharded || !opts.replicas || cluster.world_size < 2 || !member.kv) return {};
  for (auto& t : reg.tensors)
    if (t.sharded() || cluster.is_chief()) reg.kept_layout.push_back(t);
  replica_keeper::config rc;
  rc.rank = cluster.rank;
  rc.world = cluster.world_size;
  rc.local_world = local_world_size();
  rc.host = cluster.host;
  rc.token = cluster.token;
  rc.kv = member.kv;
  rc.prefix = member.prefix;
  rc.log = log;
  rc.mirror = mirror_store();
  auto k = replica_keeper::start(rc, reg.kept_layout);
  if (!k) return k.err();
  std::shared_ptr<replica_keeper> keeper = std::move(*k);
  size_t bytes = 0;
  for (auto& t : reg.kept_layout) bytes += t.bytes();
  log->info("replicas: this rank keeps copies of its part ({:.2f} MiB) and of rank {}'s; rank {} keeps a copy of "
            "this rank's",
            bytes / 1048576.0, keeper->source(), keeper->holder());
  reg.replicas->set(std::move(keeper));
  return {};
}

std::shared_ptr<checkpoint_store> session::impl::mirror_store() const {
  if (!node_local_world() || cluster.memory_dir.empty()) return nullptr;
  std::error_code ec;
  std::filesystem::create_directories(cluster.memory_dir, ec);
  if (ec) {
    log->warn("replicas: cannot use the memory directory {} ({}): parts are not mirrored there", cluster.memory_dir,
              ec.message());
    return nullptr;
  }
  auto store = std::make_shared<checkpoint_store>(cluster.memory_dir, 0);
  store->set_direct_io(false);  // tmpfs has no O_DIRECT, and needs none
  store->set_signing_key(ckpt_key);
  return store;
}

result<uint64_t> session::attach() {
  auto& d = *impl_;
  if (d.member.attached) return error{errc::invalid_input, "attach() called twice"};
  if (d.member.standby_error) return *d.member.standby_error;
  if (d.opts.cluster) {
    d.cluster = *d.opts.cluster;
  } else {
    auto c = cluster_from_environment();
    if (!c) return c.err();
    d.cluster = *c;
  }
  auto secret = resolve_member_secret(d.cluster, {d.opts.token_file, d.opts.insecure},
                                      [](const char* v) -> const char* { return std::getenv(v); });
  if (!secret) return secret.err();
  if (*secret == secret_mode::insecure)
    d.log->warn("grace: INSECURE: {} spans hosts and this job has no secret (--insecure / GRACE_INSECURE=1): "
                "anyone who reaches {}:{} can join it", d.cluster.source, d.cluster.coordinator_host,
                d.cluster.coordinator_port);
  if (auto st = d.choose_key(*secret); !st) return st.err();
  set_event_identity(d.cluster.rank, d.cluster.incarnation);
  d.wire.tls = tls_files_from({}, [](const char* v) { return std::getenv(v); });
  if (auto st = check_tls_files(d.wire.tls, "GRACE_TLS_"); !st) return st.err();
  if (d.cluster.host.empty()) {
    auto adv = advertised_address_from_environment(d.cluster.coordinator_host);
    if (!adv) return adv.err();
    d.cluster.host = adv->address;
    d.cluster.iface = adv->iface;
    d.cluster.host_source = adv->source;
  }
  d.log->info("grace: rank {}/{} (cluster from {}), incarnation {}, address {} ({}), checkpoints in {}", d.cluster.rank,
              d.cluster.world_size, d.cluster.source, d.cluster.incarnation, d.cluster.host, d.cluster.host_source,
              d.opts.checkpoint_dir);

  for (auto& t : d.reg.tensors)
    if (t.memory == memory_kind::device && !device_copy_available())
      return error{errc::invalid_input, "tensor '" + t.name +
                                            "' is in device memory but no CUDA device-copy "
                                            "hook is registered (a CUDA build calls register_cuda_device_copy())"};
  if (auto st = d.check_sharding(); !st) return st.err();
  const char* repl = std::getenv("GRACE_REPLACEMENT");
  d.member.replacement = repl && std::string(repl) == "1";
  // Restore first, so the join carries the restored step.
  if (auto st = d.restore(); !st) return st.err();
  if (auto st = d.start_actors(); !st) return st.err();
  d.start_state_server();
  if (auto st = d.join(); !st) return st.err();
  d.member.joined = true;
  if (auto st = d.check_shared_dir(); !st) return d.leave_failed_attach(st.err());
  if (auto st = d.start_replicas(); !st) return st.err();
  d.start_signal_watcher();
  d.saves.last_periodic_ns = d.attached_ns = mono_ns();
  d.saves.periodic_retry =
      save_backoff(1'000'000'000, std::max<int64_t>(1'000'000'000, d.opts.save_retry_max.count() * 1'000'000));
  if (d.opts.save_every_auto)
    d.saves.auto_interval.emplace(
        d.opts.mtbf_prior_seconds,
        read_failure_history((std::filesystem::path(d.opts.checkpoint_dir) / failure_history_file).string()));
  d.member.attached = true;
  if (d.member.replacement)
    if (auto st = d.await_recovery(); !st) return st.err();
  return d.completed;
}

/// Restores from the fallback directory when it holds a newer checkpoint
/// (a preemption save the primary could not take), else from the primary.
result<restored_checkpoint> session::impl::restore_newest() {
  if (saves.fallback_store) {
    const uint64_t primary = saves.store->newest_valid_step();
    if (saves.fallback_store->newest_valid_step() > primary) {
      auto r = saves.fallback_store->restore_latest(reg.tensors, saves.buffers->regions());
      if (r && r->found && r->manifest.step > primary) {
        log->warn("restoring step {} from the fallback directory {}: the newest checkpoint in {} is step {}",
                  r->manifest.step, saves.fallback_store->dir().string(), saves.store->dir().string(), primary);
        return r;
      }
    }
  }
  return saves.store->restore_latest(reg.tensors, saves.buffers->regions());
}

/// The checkpoint key from the options or the launcher's environment. A
/// --workers/TF_CONFIG member in "auto" mode signs when its secret was given.
status session::impl::choose_key(secret_mode secret) {
  auto env = [](const char* v) -> std::string {
    const char* s = std::getenv(v);
    return s ? s : "";
  };
  const std::string file = !opts.checkpoint_key_file.empty() ? opts.checkpoint_key_file : env("GRACE_CHECKPOINT_KEY_FILE");
  std::string mode_text = !opts.checkpoint_signing.empty() ? opts.checkpoint_signing : env("GRACE_CHECKPOINT_SIGNING");
  auto mode = parse_signing_mode(mode_text.empty() ? "auto" : mode_text, "GRACE_CHECKPOINT_SIGNING");
  if (!mode) return mode.err();
  auto key = choose_checkpoint_key(file, *mode, cluster.token, secret == secret_mode::given);
  if (!key) return key.err();
  ckpt_key = std::move(*key);
  if (ckpt_key) log->info("grace: checkpoints signed with key {} ({})", ckpt_key->id, ckpt_key->origin);
  return {};
}

status session::impl::restore() {
  saves.store = std::make_unique<checkpoint_store>(opts.checkpoint_dir, opts.keep_last);
  saves.store->set_signing_key(ckpt_key);
  if (!opts.fallback_checkpoint_dir.empty()) {
    saves.fallback_store = std::make_unique<checkpoint_store>(opts.fallback_checkpoint_dir, opts.keep_last);
    saves.fallback_store->set_restoring_rank(cluster.rank, static_cast<int>(cluster.world_size));
    saves.fallback_store->set_signing_key(ckpt_key);
  }
  saves.store->set_aside_damaged_on_restore(true);
  saves.store->set_restoring_rank(cluster.rank, static_cast<int>(cluster.world_size));
  if (cluster.is_chief()) saves.store->remove_stale_temporaries();
  // The snapshot buffers first: the restore reads into them (warm pages,
  // and a checkpoint that fails verification never touches the tensors).
  saves.buffers = std::make_shared<snapshot_buffers>(reg.tensors);
  auto t0 = mono_ns();
  if (member.replacement) {
    // A replacement takes the group's state from a peer (recover_in_place).
    start_warmer();
    return {};
  }
  auto restored = restore_newest();
  if (!restored) return restored.err();
  for (auto& s : restored->skipped) log->warn("skipped checkpoint {}: {}", s.path.string(), s.reason);
  if (restored->found) {
    member.restored_any = true;
    completed = restored->manifest.step;
    const auto& own = restored->own;
    for (auto& [name, p] : reg.counters) {
      auto it = own.counters.find(name);
      if (it != own.counters.end()) *p = it->second;
    }
    if (auto b = restore_blobs(*restored, own); !b) return b;
    log->info("restored step {} from {} ({} tensors, {:.1f} ms)", completed, restored->path.string(),
              restored->loaded.size(), (mono_ns() - t0) / 1e6);
    emit_event("restored", {{"step", completed}, {"path", restored->path.string()}, {"ns", mono_ns() - t0}});
  }
  member.restored_step = completed;
  wire.ctl->started = completed;
  wire.ctl->completed = completed;
  start_warmer();
  return {};
}

/// The actor system, and the coordinator: in-process for one worker or for
/// rank 0 of a --workers/TF_CONFIG cluster; remote under grace-launch.
status session::impl::start_actors() {
  system_options so;
  so.tls = wire.tls;
  wire.rt = std::make_unique<actor_runtime>(so);
  auto& sys = wire.rt->sys();
  bool launched = cluster.source == "GRACE_*";
  if (cluster.local_mode() || (!launched && cluster.is_chief())) {
    coordinator_config cc;
    cc.world_size = cluster.world_size;
    cc.run_id = cluster.run_id;
    cc.token = cluster.token;
    cc.incarnation = cluster.incarnation;
    cc.dead_after = opts.dead_after;
    cc.connection_timeout = system_options{}.connection_timeout;
    cc.log = log;
    wire.hosted = spawn_coordinator(sys, cc);
    wire.coord->set(wire.hosted);
    if (!cluster.local_mode()) {
      auto port = publish_coordinator(sys, wire.hosted, cluster.coordinator_port, cluster.coordinator_host);
      if (!port) return port.err();
      if (auto w = plaintext_warning(cluster.coordinator_host, wire.tls.any())) log->warn("{}", *w);
    }
  } else {
    auto h = connect_coordinator(sys, cluster.coordinator_host, cluster.coordinator_port, opts.connect_timeout);
    if (!h) return h.err();
    wire.coord->set(*h);
  }
  peer_watcher_config pc;
  pc.rank = cluster.rank;
  pc.incarnation = cluster.incarnation;
  pc.heartbeat = opts.heartbeat;
  pc.log = log;
  pc.coordinator_file = cluster.coordinator_file;
  pc.epoch = cluster.coordinator_epoch;
  pc.failover_wait = std::chrono::milliseconds(cluster.failover_wait_ms);
  if (!cluster.relay.empty()) {
    if (auto r = connect_node_relay(sys, cluster.relay, std::chrono::seconds(10)))
      pc.relay = *r;
    else
      log->warn("{}: heartbeats and acknowledgements go to the service directly", r.err().message);
  }
  checkpoint_writer_config wc;
  wc.store = saves.store.get();
  wc.fallback = saves.fallback_store.get();
  wc.coord = wire.coord;
  wc.rank = cluster.rank;
  wc.incarnation = cluster.incarnation;
  wc.ctl = wire.ctl;
  wc.log = log;
  wc.commit_delay = opts.commit_delay;
  wc.commit_delay_step = opts.commit_delay_step;
  if (auto lw = node_local_world()) {
    wc.node = static_cast<int32_t>(cluster.rank / lw);
    wc.token = cluster.token;
  }
  saves.writer = spawn_checkpoint_writer(sys, wc);
  pc.on_commit_parts = [w = saves.writer](uint64_t id, uint64_t step, std::vector<std::string> servers) {
    caf::anon_send(w, commit_atom::value, id, step, std::move(servers));
  };
  pc.freeze_copies = [r = reg.replicas] { return freeze_copies(*r); };
  wire.watcher = spawn_peer_watcher(sys, wire.coord, wire.ctl, pc);
  wire.self = std::make_unique<caf::scoped_actor>(sys);
  (*wire.self)->monitor(saves.writer);
  // The first save must not fault in the write staging on its critical
  // path (after a restore the pages are resident already; this then only
  // rewrites them, on the writer's thread).
  caf::anon_send(saves.writer, prepare_atom::value, static_cast<uint64_t>(saves.buffers->total_bytes()));
  return {};
}

/// Joins through the peer watcher; the welcome carries the rendezvous
/// prefix and how long the service may take to decide after a failure,
/// which bounds this worker's waits.
status session::impl::join() {
  auto& sys = wire.rt->sys();
  char host[256] = "?";
  ::gethostname(host, sizeof(host) - 1);
  auto m = make<proto::Join>([&](auto b) {
    b.setRank(cluster.rank);
    b.setWorldSize(cluster.world_size);
    b.setRunId(cluster.run_id);
    b.setIncarnation(cluster.incarnation);
    b.setToken(cluster.token);
    b.setProtocolVersion(proto::PROTOCOL_VERSION);
    b.setHost(host);
    b.setPid(static_cast<uint32_t>(::getpid()));
    b.setCompletedStep(completed);
    b.setSharded(reg.sharded);
    b.setNodeLocal(node_local_world());
    b.setInPlace(member.donor != nullptr);
    if (member.donor) b.setStateEndpoint(member.donor->endpoint());
    b.setReplacement(member.replacement);
  });
  // A join for the next incarnation is refused (restartable, naming the
  // current one) while the old group still has live members: asked again
  // until they are gone, within the join timeout.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (;;) {
    std::optional<error> failure;
    bool wait_for_old_group = false;
    {
      caf::scoped_actor self{sys};
      self->request(wire.watcher, std::chrono::seconds(30), join_atom::value, m)
          .receive(
              [&](msg<proto::Welcome>& w) {
                auto r = decode(w);
                if (!r) {
                  failure = r.err();
                  return;
                }
                auto wr = r->get();
                if (!wr.getAccepted()) {
                  wait_for_old_group = wr.getRestartable() && wr.getIncarnation() + 1 == cluster.incarnation;
                  // Steps that differ: this group cannot form (its launcher
                  // counts a failed rendezvous and names the leveling).
                  const errc why = wr.getStepsDiffer()  ? errc::disconnected
                                   : wr.getRestartable() ? errc::preempted
                                                         : errc::invalid_input;
                  failure = error{why, "the coordination service refused rank " + std::to_string(cluster.rank) +
                                           ": " + str(wr.getReason())};
                  return;
                }
                if (wr.getRank() != cluster.rank || wr.getWorldSize() != cluster.world_size ||
                    str(wr.getRunId()) != cluster.run_id || wr.getIncarnation() != cluster.incarnation) {
                  failure = error{errc::invalid_input,
                                  "the coordination service welcomed rank " + std::to_string(wr.getRank()) + " of " +
                                      std::to_string(wr.getWorldSize()) + " in run '" + str(wr.getRunId()) +
                                      "' incarnation " + std::to_string(wr.getIncarnation()) + " (protocol error)"};
                  return;
                }
                member.prefix = str(wr.getRendezvousPrefix());
                if (wr.getVerdictWaitMs()) member.verdict_wait = std::chrono::milliseconds(wr.getVerdictWaitMs());
              },
              [&](caf::error& e) {
                failure = error{errc::disconnected, "join: " + sys.render(e)};
              });
    }
    if (!failure) break;
    if (!wait_for_old_group || std::chrono::steady_clock::now() > deadline) return *failure;
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  worker_policy_config pc;
  pc.rank = cluster.rank;
  pc.is_chief = cluster.is_chief();
  pc.restart_code = opts.restart_exit_code;
  pc.fatal_code = exit_code::fatal;
  pc.verdict_wait_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(member.verdict_wait).count();
  pc.save_wait_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(opts.save_timeout).count();
  pc.margin_factor = opts.margin_factor;
  pc.margin_steps = opts.margin_steps;
  pc.replacement = member.replacement;
  if (!cluster.coordinator_file.empty()) {
    // A successor service may take the group over: the verdict may come
    // from it, after the failover, and nobody saves without it.
    pc.verdict_wait_ns += static_cast<int64_t>(cluster.failover_wait_ms) * 1'000'000;
    pc.save_alone_without_coordinator = false;
  }
  // The chief holds only its own part of sharded state.
  if (reg.sharded) pc.save_alone_without_coordinator = false;
  member.policy = std::make_unique<worker_policy>(pc, completed);
  if (!cluster.local_mode()) member.kv = std::make_shared<coordinator_store>(sys, wire.coord->get(), opts.wait_timeout);
  return {};
}

void session::impl::start_signal_watcher() {
  signal_watcher_config sc;
  sc.notice_file = opts.notice_file;
  sc.notice_command = opts.notice_command;
  sc.callback = opts.notice_callback;
  sc.poll_interval = opts.poll_interval;
  sc.grace_period = opts.grace_period;
  auto w = wire.watcher;
  auto r = cluster.rank;
  auto observer = opts.notice_observer;
  wire.signals = std::make_unique<signal_watcher>(sc, [w, r, observer](const notice_info& n) {
    if (observer) observer(notice_source_name(n.source), n.detail);
    caf::anon_send(w, make<proto::Notice>([&](auto b) {
                     b.setRank(r);
                     b.setSource(static_cast<proto::NoticeSource>(n.source));
                     b.setDetail(n.detail);
                     b.setReceivedNs(n.received_ns);
                     b.setDeadlineNs(n.deadline_ns);
                   }));
  });
}

}  // namespace grace
