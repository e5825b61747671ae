# Grace's protocol: every message between processes (and between a
# worker's own actors and the coordination service). Ordinals never change
# once shipped; new fields get new ordinals; a field no longer used is
# renamed `obsolete...` and never written, its ordinal never reused.
# Bump `protocolVersion` only for incompatible changes.
@0xd1c7a3e58b2f4c19;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("grace::proto");

const protocolVersion :UInt32 = 1;

# ---- membership -------------------------------------------------------------

struct Join {
  rank @0 :UInt32;
  worldSize @1 :UInt32;
  runId @2 :Text;
  incarnation @3 :UInt32;
  token @4 :Text;
  protocolVersion @5 :UInt32;
  host @6 :Text;
  pid @7 :UInt32;
  completedStep @8 :UInt64;   # step restored from a checkpoint (0: fresh);
                              # with rejoin: the step this worker completed
  rejoin @9 :Bool;            # the service moved (etcd failover): a survivor of
                              # this incarnation rejoins the successor, which saves
                              # the survivors just in time (runtime/coordination/agreement.hpp)
  relayed @10 :Bool;          # registered with its node's relay: the service sends
                              # this member's orders through the relay (actors/node_relay.hpp)
  sharded @11 :Bool;          # holds sharded state: every member writes its part of
                              # each checkpoint, which commits once all parts are durable
  nodeLocal @12 :UInt32;      # sharded state in node-local directories: ranks per node
                              # (every node commits its own parts); 0: one shared directory
  inPlace @13 :Bool;          # can recover in place: re-forms its collectives when the
                              # group changes, and serves its state to peers (Recover)
  stateEndpoint @14 :Text;    # with inPlace: "address:port" of its state server
  replacement @15 :Bool;      # started to take a lost rank's place in this incarnation:
                              # restores nothing, takes its state from a peer (Recover)
}

struct Welcome {
  accepted @0 :Bool;
  reason @1 :Text;            # why a join was refused
  rank @2 :UInt32;
  worldSize @3 :UInt32;
  runId @4 :Text;
  incarnation @5 :UInt32;
  rendezvousPrefix @6 :Text;  # fresh key prefix for this incarnation's collectives
  restartable @7 :Bool;       # refused only for now: exit with the restart code
                              # (a late join after the group lost a member)
  verdictWaitMs @8 :UInt32;   # longest the service takes to decide after a
                              # failure (dead-after + its check + the connection
                              # timeout): a member's waits at a boundary end by then
  stepsDiffer @9 :Bool;       # refused because it restored another step than the
                              # group (checkpoint directories not level): this group
                              # cannot form, a failed rendezvous (exit 45), not a restart
}

struct Heartbeat {
  rank @0 :UInt32;
  incarnation @1 :UInt32;
  completedStep @2 :UInt64;
  obsoleteSentNs @3 :Int64;   # obsolete: never read
  lastStepNs @4 :Int64;       # duration of the last step
  lastSaveNs @5 :Int64;       # duration (snapshot + write) of the last save, 0: none yet
}

enum LossReason {
  dead @0;                    # connection lost or process gone
  hung @1;                    # alive but no progress for longer than the timeout
  left @2;                    # left the cluster on purpose
}

struct PeerLost {
  rank @0 :UInt32;
  reason @1 :LossReason;
  lastStep @2 :UInt64;
  detail @3 :Text;
  incarnation @4 :UInt32;     # the group the verdict is about (a relay acts on its own ranks' only in it)
}

struct Leave {
  rank @0 :UInt32;
  exitCode @1 :Int32;         # 0: finishing; anything else ends the group's round
  obsoleteCompletedStep @2 :UInt64;  # obsolete: never read
}

# ---- preemption: notice, claim, agreement, save -------------------------------

enum NoticeSource {
  signal @0;                  # SIGTERM / SIGINT
  file @1;                    # a notice file appeared
  command @2;                 # a watcher command exited 0
  callback @3;                # a user callback (e.g. a cloud maintenance query)
  launcher @4;                # the launcher forwarded a signal it received
  test @5;
}

struct Notice {
  rank @0 :UInt32;            # who received it (launcherRank for the launcher)
  source @1 :NoticeSource;
  detail @2 :Text;
  receivedNs @3 :Int64;
  deadlineNs @4 :Int64;       # 0: no deadline known (no grace period)
}

const launcherRank :UInt32 = 0xffffffff;

struct Claim {
  notice @0 :Notice;
  startedStep @1 :UInt64;     # claimant's step in progress (or last completed)
}

struct ClaimReply {
  won @0 :Bool;
  holder @1 :UInt32;          # rank that holds the claim
  agreementId @2 :UInt64;
}

enum CheckpointKind {
  initial @0;                 # first save after a notice
  final @1;                   # grace-period final save, then exit
  jit @2;                     # just-in-time save after a peer was lost
  periodic @3;
}

# Coordinator -> workers. First sent with agreed = false: a proposal whose
# `step` is a lower bound. Each worker acknowledges with the earliest step at
# which it can still stop; the agreed step is the maximum of those, sent
# again with agreed = true. `saver` is the rank that writes (the chief, or
# for a just-in-time save the survivor with the most completed steps).
struct CheckpointAt {
  agreementId @0 :UInt64;
  step @1 :UInt64;
  kind @2 :CheckpointKind;
  agreed @3 :Bool;
  saver @4 :UInt32;
  deadlineNs @5 :Int64;
  exitAfter @6 :Bool;         # exit with the restart code once saved
  allSave @7 :Bool;           # sharded state: every member writes its part; `saver`
                              # commits them when told (CommitParts)
  fromKept @8 :Bool;          # sharded, just in time: each member writes its kept copy
                              # of `step` (runtime/checkpoint/replica.hpp), not its live state
  fromReplica @9 :List(UInt32);  # ...and the holders of these members' replicas write theirs
}

# Recovery in place (runtime/coordination/agreement.hpp, "Recovery in
# place"): the survivors of a loss acknowledged their completed steps in the
# just-in-time round `agreementId`; the group resumes after `step` without
# restarting. Every member not at `step` (and each replacement) takes the
# state of `step` from `donor` over the bulk channel at `donorEndpoint`;
# then everyone forms its collectives again under `rendezvousPrefix`.
struct Recover {
  agreementId @0 :UInt64;
  step @1 :UInt64;
  donor @2 :UInt32;
  donorEndpoint @3 :Text;
  rendezvousPrefix @4 :Text;
  replaced @5 :List(UInt32);  # the ranks whose processes were replaced
}

# A member holds the state of recovery round `agreementId` and formed its
# collectives again.
struct Recovered {
  agreementId @0 :UInt64;
  rank @1 :UInt32;
}

struct Ack {
  agreementId @0 :UInt64;
  rank @1 :UInt32;
  earliestStep @2 :UInt64;    # earliest step at which this worker can stop
  keptSteps @3 :List(UInt64); # sharded state, just in time: steps of its own part it
                              # keeps a copy of (runtime/checkpoint/replica.hpp)
  holdsReplica @4 :Bool;      # it holds a replica of member `replicaOf`'s part,
  replicaOf @5 :UInt32;
  replicaSteps @6 :List(UInt64);  # whole at these steps
}

struct FileInfo {
  name @0 :Text;
  size @1 :UInt64;
  checksum @2 :Text;
}

struct CheckpointSaved {
  agreementId @0 :UInt64;
  rank @1 :UInt32;
  step @2 :UInt64;
  ok @3 :Bool;
  error @4 :Text;
  obsoleteFiles @5 :List(FileInfo);  # obsolete: the manifest on disk holds them
  bytes @6 :UInt64;
  snapshotNs @7 :Int64;
  writeNs @8 :Int64;
  obsoleteCommitNs @9 :Int64;  # obsolete: never set
  obsoletePath @10 :Text;      # obsolete: never read
  part @11 :Bool;              # phase 1 of a sharded save: this rank's part is durable
                               # (agreementId 0: a periodic save)
}

# Coordinator -> the committer (phase 2 of a sharded save): every member's
# part of `step` is durable; commit them as one checkpoint and report it
# with a CheckpointSaved (part = false).
struct CommitParts {
  agreementId @0 :UInt64;     # 0: a periodic save
  step @1 :UInt64;
  servers @2 :List(Text);     # node-local directories: node n's checkpoint server
                              # ("address:port", "" unknown), where the committer
                              # of each node reads the other nodes' part descriptions
}

# Committer -> coordinator, just before it commits the parts of a sharded
# save (the rename that makes them a checkpoint): is this rank still a
# member of the group? A committer frozen or cut off while it held the order
# may be back after the group declared it dead; it must not commit then
# (fencing). No answer within the writer's bound counts as no.
struct CommitCheck {
  rank @0 :UInt32;
  agreementId @1 :UInt64;     # 0: a periodic save
  step @2 :UInt64;
  incarnation @3 :UInt32;
}

struct CommitCheckReply {
  ok @0 :Bool;
  reason @1 :Text;            # why not, when !ok
}

# Chief -> coordinator during a grace-period countdown: the time left has
# reached the margin; propose the final checkpoint.
struct ProposeFinal {
  rank @0 :UInt32;
  startedStep @1 :UInt64;
  obsoleteAgreementId @2 :UInt64;  # obsolete: never set
}

# Coordinator -> chief: a later notice brought an earlier deadline.
struct DeadlineUpdate {
  agreementId @0 :UInt64;
  deadlineNs @1 :Int64;
}

# Coordinator -> workers: the checkpoint of an agreement is on disk.
struct Committed {
  agreementId @0 :UInt64;
  step @1 :UInt64;
  exitAfter @2 :Bool;
}

# ---- errors -------------------------------------------------------------------

enum ErrorKind {
  failed @0;
  overloaded @1;
  disconnected @2;
  preempted @3;
  invalidInput @4;
}

# An error in a worker's step: every worker stops with it (exit 3).
struct ErrorReport {
  rank @0 :UInt32;
  step @1 :UInt64;
  obsoleteKind @2 :ErrorKind;  # obsolete: always `failed`, never read
  message @3 :Text;
}

struct ClusterError {
  originRank @0 :UInt32;
  step @1 :UInt64;
  obsoleteKind @2 :ErrorKind;  # obsolete: always `failed`, never read
  message @3 :Text;
}

# Obsolete: never sent (the launcher stops a job through a notice or by
# killing its workers). Kept so its type id is never reused.
struct Shutdown {
  reason @0 :Text;
  exitCode @1 :Int32;
}

# ---- key-value store and barriers (also the Gloo / NCCL rendezvous) ----------

struct KvSet {
  key @0 :Text;
  value @1 :Data;
}

struct KvGet {
  key @0 :Text;
  timeoutMs @1 :UInt32;
}

struct KvReply {
  ok @0 :Bool;
  value @1 :Data;
  error @2 :Text;             # "already exists", "timeout: ...", ...
}

struct Barrier {
  name @0 :Text;
  rank @1 :UInt32;
  count @2 :UInt32;
  obsoleteTimeoutMs @3 :UInt32;  # obsolete: a barrier waits for its members or a loss
}

struct BarrierReply {
  ok @0 :Bool;
  error @1 :Text;
}

# ---- per-host aggregation (a node relay in each launcher of a multi-node job) --

struct HeartbeatBatch {       # node relay -> coordinator, once per heartbeat interval
  node @0 :Int32;             # the relay's node: every beat is of one of its ranks
  beats @1 :List(Heartbeat);  # the newest heartbeat of each local worker heard since the last batch
}

struct AckBatch {             # node relay -> coordinator, once the node's workers acknowledged
  node @0 :Int32;
  acks @1 :List(Ack);
}

# ---- elastic groups (grace-launch --nnodes MIN:MAX, runtime/coordination/elastic.hpp) ------

# Launcher -> coordinator before each group: the first group this node may
# take part in, in incarnation `fromIncarnation` or later. Answered once the
# plan of that incarnation is decided (the service holds the request).
struct GroupPlanRequest {
  node @0 :Int32;              # the launcher's node rank (--node-rank)
  fromIncarnation @1 :UInt32;  # its previous group's + 1, or where it starts
  host @2 :Text;               # the address this node advertises to its peers
}

enum PlanStatus {
  plan @0;       # `nodes` are the group, in slot order: this node is in it
  excluded @1;   # the group of `incarnation` formed without this node: ask
                 # from incarnation + 1 (a group smaller than MAX saves and
                 # restarts with it)
  refused @2;    # not the launcher of a node of this job (`reason`)
  finished @3;   # the job is finishing: no group left to join
}

struct GroupPlan {
  status @0 :PlanStatus;
  incarnation @1 :UInt32;
  nodes @2 :List(Int32);       # slot -> node rank, ascending
  hosts @3 :List(Text);        # slot -> the address that node advertises
  workersPerNode @4 :UInt32;
  reason @5 :Text;
}

# ---- launchers and node relays <-> the coordination service -----------------
# (grace-launch, actors/launcher*.cpp and actors/node_relay.cpp; the service
# accepts these only from a launcher's process: coordinator_senders.cpp)

struct LauncherRegister {      # a launcher on node > 0 registers its process as the node's launcher
  node @0 :Int32;              # --node-rank
  workersPerNode @1 :Int32;    # --nproc
  token @2 :Text;              # the job's secret
  minNodes @3 :Int32;          # --nnodes MIN:MAX (MIN = MAX when not elastic)
  maxNodes @4 :Int32;
}

struct LauncherRegisterReply {
  refused @0 :Text;            # empty: registered; else why not
}

struct WorkerExited {          # a launcher's worker process exited before it left on purpose
  rank @0 :UInt32;
  incarnation @1 :UInt32;
  code @2 :Int32;              # its exit code, 128 + signal when killed
}

struct CheckpointPeers {       # registers this node's checkpoint server and asks for the others'
  node @0 :Int32;
  endpoint @1 :Text;           # "address:port"; empty: only asks
}

struct CheckpointPeersReply {
  endpoints @0 :List(Text);    # the other nodes' checkpoint servers
}

struct RelayRegister {         # a node relay speaks for the ranks of its node from now on
  node @0 :Int32;
  workersPerNode @1 :Int32;
}

struct IncarnationQuery {      # the service's current incarnation; the host launcher (node 0) also sets it
  set @0 :Bool;
  incarnation @1 :UInt32;      # with `set`: the incarnation the next group starts in
}

struct IncarnationReply {
  incarnation @0 :UInt32;
}

struct ResizeQuery {           # elastic: did incarnation N end to take in a waiting node?
  incarnation @0 :UInt32;
}

struct ResizeReply {
  grew @0 :Bool;
}

struct OwedQuery { }           # elastic, once finished: nodes not yet told the job finished

struct OwedReply {
  nodes @0 :Text;              # "1,3"; empty: none
}

struct StatusQuery { }         # one line about the service, for an operator

struct StatusReply {
  text @0 :Text;
}
