#!/usr/bin/env bash
# Grace under a real SLURM (one node: slurmctld + slurmd + munged started by
# this test, tests/slurm/cluster.sh). The job (tests/slurm/grace_job.sbatch)
# runs grace-launch with its configuration from SLURM's environment.
#  A: scancel --signal=TERM --batch: the job saves, exits 42, requeues itself,
#     resumes from the checkpoint and ends bit-identical.
#  B: sbatch --time=1 --signal=B:TERM@30 and --grace-period-ms 30000: SLURM's
#     warning is the grace period: a save at once, training goes on, a final
#     save before the deadline, exit 42, requeue, resume, bit-identical.
# SLURM holds a requeued job for ~2 minutes (its BeginTime); the test lets it
# start at once (scontrol update StartTime=now), as an operator may.
# After the test no slurmd, slurmctld or munged is left running.
source "$(dirname "$0")/../integration/lib.sh"
source "$(dirname "$0")/cluster.sh"
HERE=$(cd "$(dirname "$0")" && pwd)
sl_start
STEPS=1200
REF=$(reference 2 --steps $STEPS)
export GRACE_LAUNCH GRACE_TRAIN

submit() { # submit DIR TRAIN-ARGS SBATCH-ARGS...: sets J
  local dir=$1 targs=$2; shift 2
  mkdir -p "$dir"
  J=$(cd "$dir" && CKPT_DIR="$dir/ck" OUT="$dir/out.json" TRAIN_ARGS="$targs" \
      GRACE_EVENTS_FILE="$dir/events.jsonl" sbatch --parsable -J grace -o "$dir/job.out" "$@" "$HERE/grace_job.sbatch")
  [ -n "$J" ] || fail "sbatch failed"
}

step_of() { # step_of FILE EXPR: the step of the first matching event
  events "$1" "$2" | "$PY" -c 'import json,sys; print(json.loads(sys.stdin.readline())["step"])'
}

# Requeued by the job script after exit 42; release SLURM's hold; finish.
resume_and_finish() { # resume_and_finish DIR
  local end=$((SECONDS + 120))
  until scontrol show job "$J" | grep "JobState=PENDING.*" >/dev/null && scontrol show job "$J" | grep "Restarts=1 " >/dev/null; do
    [ $SECONDS -lt $end ] || { cat "$1/job.out"; fail "job $J was not requeued"; }
    sleep 0.2
  done
  # slurmd refuses a launch credential from the same second as the killed
  # run's revocation ("Job credential revoked": SLURM's own hold avoids it),
  # so release it 2 s later.
  sleep 2
  # Refused while the requeued job is still completing: repeat until it runs.
  end=$((SECONDS + 60))
  while [ "$(sl_state "$J")" = PENDING ] && [ $SECONDS -lt $end ]; do
    scontrol update jobid="$J" StartTime=now 2>/dev/null || true
    sleep 1
  done
  sl_wait_state "$J" "COMPLETED|FAILED|CANCELLED|TIMEOUT" 150
  [ "$(sl_state "$J")" = COMPLETED ] || { cat "$1/job.out"; fail "job $J ended $(sl_state "$J")"; }
  scontrol show job "$J" | grep "Restarts=1 " >/dev/null || { scontrol show job "$J"; fail "job $J was not requeued once"; }
  local out="$1/out.json"
  [ "$(json "$out" steps_done)" -eq $STEPS ] || fail "steps_done != $STEPS"
  [ "$(json "$out" step_index_sum)" -eq $((STEPS * (STEPS + 1) / 2)) ] || fail "a step ran twice or never"
  [ "$(json "$out" weights_checksum)" = "$REF" ] || fail "final weights differ from the uninterrupted run"
  grep -q "from the SLURM environment: nodes 1 (SLURM_NNODES), node rank 0 (SLURM_NODEID), coordinator $(hostname -s):$((29400 + J % 1000)) (SLURM_JOB_NODELIST:SLURM_JOB_ID), run id slurm-$J (SLURM_JOB_ID)" "$1/job.out" \
    || { head -5 "$1/job.out"; fail "grace-launch must say it took its settings from SLURM"; }
}

# A: scancel --signal=TERM --batch
A="$WORK/a"
submit "$A" "--steps $STEPS --step-delay-ms 5"
tb_events="$A/events.jsonl"
await_events "$tb_events" "e['event']=='first_step'" 2 60 || { cat "$A/job.out"; fail "job A did not start training"; }
scancel --signal=TERM --batch "$J"
resume_and_finish "$A"
saved=$(step_of "$A/events.jsonl" "e['event']=='committed'")
restored=$(step_of "$A/events.jsonl" "e['event']=='restored'")
[ "$saved" = "$restored" ] || fail "job A: saved step $saved, restored $restored"
grep -q "grace-launch exited 42" "$A/job.out" && grep -q "grace-launch exited 0" "$A/job.out" || { cat "$A/job.out"; fail "job A: exit codes"; }
pass "scancel --signal=TERM --batch: saved step $saved, exit 42, requeued, restored $saved, weights identical"

# B: the time limit's warning signal and a grace period
B="$WORK/b"
t0=$(date +%s)
GRACE_PERIOD_MS=30000 submit "$B" "--steps $STEPS --step-delay-ms 50" --time=1 --signal=B:TERM@30
resume_and_finish "$B"
ev="$B/events.jsonl"
[ "$(count_events "$ev" "e['event']=='notice' or (e['event']=='claim' and e['deadline_ns']>0)")" -ge 1 ] || fail "job B: no notice with a deadline"
initial=$(step_of "$ev" "e['event']=='agreed' and e['kind']=='initial'")
final=$(step_of "$ev" "e['event']=='agreed' and e['kind']=='final'")
restored=$(step_of "$ev" "e['event']=='restored'")
[ "$final" -gt "$initial" ] || fail "job B: the final save ($final) must come after the first ($initial): training goes on in the grace period"
[ "$restored" = "$final" ] || fail "job B: restored $restored, the final save was $final"
grep -q "grace period 30000 ms" "$B/job.out" || { cat "$B/job.out"; fail "job B: the launcher must forward the notice with its grace period"; }
pass "sbatch --signal=B:TERM@30 (grace period 30 s): saved at $initial, trained on, final save at $final, requeued, restored $final, weights identical ($(( $(date +%s) - t0 )) s)"

sl_stop
left=$(pgrep -l -x 'slurmd|slurmctld|munged' || true)
[ -z "$left" ] || fail "daemons left running: $left"
pass "slurmd, slurmctld and munged stopped"
