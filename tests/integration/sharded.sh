#!/usr/bin/env bash
# Sharded state (grace-train --shard-optimizer, ZeRO-1): every rank writes its
# own part of each checkpoint, committed once all parts are durable.
#  - the sharded run is bit-identical to the unsharded one;
#  - SIGTERM to a random worker at a random time, SIGKILL and SIGSTOP: the run
#    finishes bit-identical to the uninterrupted sharded run, every step once;
#    after SIGKILL/SIGSTOP the survivors save just in time from their kept
#    copies and the lost rank's replica (at most two steps lost);
#  - a damaged part: the restart falls back to the previous complete checkpoint;
#  - 4 -> 2 -> 4 workers: each size change resumes at the step the previous
#    size saved, samples exactly once, and a SIGTERM during the 2-worker phase
#    ends bit-identical to the same size changes without a fault;
#  - a reader without Grace (assemble_sharded.py) assembles the same tensors
#    as `grace-ckpt export`.
source "$(dirname "$0")/lib.sh"
ASSEMBLE="$(dirname "$0")/assemble_sharded.py"
STEPS=120
ARGS=(--steps $STEPS --step-delay-ms 8 --save-every 10 --shard-optimizer)
REF=$(reference 4 "${ARGS[@]}")
PLAIN=$(reference 4 --steps $STEPS --step-delay-ms 8 --save-every 10)
[ "$REF" = "$PLAIN" ] || fail "sharded optimizer: checksum $REF, unsharded $PLAIN"
pass "ZeRO-1 run bit-identical to the unsharded run ($REF)"

first_event_step() { # first_event_step DIR EVENT
  events "$1/events.jsonl" "e['event']=='$2'" | "$PY" -c 'import json,sys; print(json.loads(sys.stdin.readline())["step"])'
}

for seed in 11 22; do
  RANDOM=$seed
  D="$WORK/term-$seed"
  start_job "$D" 4 -- "${ARGS[@]}"
  wait_for_training "$D" 4
  wait_for_save "$D" $((10 * (RANDOM % 6 + 1)))
  sleep "0.00$((RANDOM % 9))"
  victim=$(workers_of "$JOB_PID" | sort | sed -n "$((RANDOM % 4 + 1))p")
  kill -TERM "$victim"
  wait_job
  check_finished "$D" $STEPS "$REF"
  [ "$(json "$D/ck/grace-exit.json" restarts)" -eq 1 ] || fail "seed $seed: expected one restart"
  agreed=$(first_event_step "$D" agreed)
  restored=$(first_event_step "$D" restored)
  [ "$agreed" = "$restored" ] || fail "seed $seed: agreed $agreed but restored $restored (a notice lost work)"
  [ "$(count_events "$D/events.jsonl" "e['event']=='part_durable' and e['step']==$agreed")" -ge 4 ] ||
    fail "seed $seed: not every rank wrote its part of step $agreed"
  pass "seed $seed: SIGTERM to pid $victim, all 4 parts of step $agreed committed and restored, weights identical"
done

for sig in KILL STOP; do
  D="$WORK/$sig"
  start_job "$D" 4 -- "${ARGS[@]}"
  wait_for_training "$D" 4
  wait_for_save "$D" 40
  victim=$(workers_of "$JOB_PID" | sort | sed -n 3p)
  kill -"$sig" "$victim"
  wait_job
  check_finished "$D" $STEPS "$REF"
  restored=$(first_event_step "$D" restored)
  # Rank 1 keeps rank 2's replica: the survivors write their kept copies and
  # rank 1 writes rank 2's part, so the restart loses at most two steps
  # (one when the last transfer arrived) of the most advanced survivor's.
  agreed=$(first_event_step "$D" agreed)
  [ "$agreed" = "$restored" ] || fail "SIG$sig: the just-in-time step $agreed was not restored ($restored)"
  # The survivors' exits in the incarnation the kill ended: the one of the
  # just-in-time agreement (a slow start, under a sanitizer, may have
  # restarted the group once before the kill).
  inc=$(events "$D/events.jsonl" "e['event']=='agreed'" | "$PY" -c 'import json,sys; print(json.loads(sys.stdin.readline())["incarnation"])')
  most=$(events "$D/events.jsonl" "e['event']=='exit' and e['incarnation']==$inc" |
    "$PY" -c 'import json,sys; print(max((json.loads(l)["step"] for l in sys.stdin), default=-1))')
  [ "$most" -ge 0 ] || fail "SIG$sig: no survivor's exit in incarnation $inc, the just-in-time round's"
  lost=$((most - restored))
  [ "$lost" -ge 0 ] && [ "$lost" -le 2 ] || fail "SIG$sig: restored step $restored, survivors had completed $most"
  [ "$(count_events "$D/events.jsonl" "e['event']=='part_durable' and e['step']==$restored")" -ge 3 ] ||
    fail "SIG$sig: the survivors did not write their parts of step $restored"
  grep -q "writing rank 2's part of step $restored from the replica" "$D/log.txt" ||
    fail "SIG$sig: rank 2's part did not come from its replica"
  pass "SIG$sig to rank 2: just-in-time save of step $restored from kept copies and rank 2's replica ($lost step(s) behind the most advanced survivor), weights identical"
done

# A kill during the two-phase commit of step 30, whose rename the committer
# (rank 0) holds back 3 s (--commit-delay-step 30): the kill comes once rank
# 1 wrote its part of step 40, so the group is past the cut step and the
# survivors' just-in-time step cannot be step 30 itself. Rank 2 (phase 2 of
# step 30 running on another rank) and rank 0 (the committer: the rename of
# step 30 never happens). The restart must restore exactly the agreed
# just-in-time step, never the cut step 30; every checkpoint is kept, so
# the test sees on disk which commits happened.
step_dir() { printf '%s/ck/step-%010d' "$D" "$1"; }   # step_dir STEP: in the job directory D
for who in 2 0; do
  D="$WORK/commit-kill-$who"
  cut=30
  start_job "$D" 4 -- "${ARGS[@]}" --commit-delay-ms 3000 --commit-delay-step $cut --keep 1000 --keep-checkpoints
  wait_for_training "$D" 4
  victim=$(workers_of "$JOB_PID" | sort | sed -n "$((who + 1))p")
  wait_for_event "$D" "e['event']=='part_durable' and e['step']==$((cut + 10)) and e['rank']==1"
  kill -KILL "$victim"
  wait_job
  check_finished "$D" $STEPS "$REF"
  # The kill landed inside the held commit: the victim's exit comes before
  # any commit of step 30.
  "$PY" - "$D/events.jsonl" "$who" "$cut" <<'PYEOF' || fail "kill of rank $who: it did not land inside the commit of step $cut"
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
who, cut = int(sys.argv[2]), int(sys.argv[3])
died = min(i for i, e in enumerate(ev) if e['event'] == 'worker_exit' and e['worker_rank'] == who and e['incarnation'] == 0)
assert ev[died]['signal'] == 9, ev[died]
assert all(i > died for i, e in enumerate(ev) if e['event'] == 'committed_local' and e['step'] == cut), "step %d committed first" % cut
PYEOF
  restored=$(first_event_step "$D" restored)
  jit=$(events "$D/events.jsonl" "e['event']=='agreed' and e['kind']=='jit'" | "$PY" -c 'import json,sys; l=sys.stdin.readline(); print(json.loads(l)["step"] if l else "none")')
  [ "$jit" != none ] || fail "kill of rank $who in the commit of step $cut: no just-in-time save was agreed"
  [ "$jit" -gt "$cut" ] || fail "kill of rank $who: just-in-time step $jit, but the group was past step $cut"
  [ -d "$(step_dir "$jit")" ] || fail "kill of rank $who: the just-in-time step $jit was agreed but never committed"
  if [ "$who" -eq 0 ]; then
    [ ! -d "$(step_dir $cut)" ] || fail "kill of the committer in the commit of step $cut: step $cut was committed anyway"
  fi
  [ "$restored" -ne "$cut" ] || fail "kill of rank $who: restored step $cut, whose commit was cut"
  [ "$restored" = "$jit" ] ||
    fail "kill of rank $who in the commit of step $cut: restored step $restored, not the just-in-time step $jit"
  [ -z "$(find "$D/ck" -maxdepth 1 -name '.parts-*')" ] || fail "kill of rank $who: parts directories left behind"
  pass "SIGKILL to rank $who during the commit of step $cut (committed after all: $([ -d "$(step_dir $cut)" ] && echo yes || echo no)): restored the just-in-time step $jit, weights identical"
done

# A damaged part: the newest checkpoint no longer verifies; the next run
# restores the one before it and still finishes with every step once.
D="$WORK/damaged"
start_job "$D" 4 -- --steps 60 --step-delay-ms 2 --save-every 10 --shard-optimizer --keep-checkpoints
wait_job
[ "$JOB_RC" -eq 0 ] || fail "damaged: first run exit $JOB_RC"
part="$D/ck/step-0000000060/rank-00003-of-00004.safetensors"
printf '\x7f' | dd of="$part" bs=1 seek=$(($(stat -c %s "$part") - 2)) conv=notrunc status=none
"$GRACE_CKPT" verify "$D/ck" --step 60 >/dev/null 2>&1 && fail "damaged part still verifies"
rm -f "$D/events.jsonl" "$D/out.json"
start_job "$D" 4 -- --steps 70 --step-delay-ms 2 --save-every 10 --shard-optimizer
wait_job
[ "$JOB_RC" -eq 0 ] || { tail -20 "$D/log.txt"; fail "damaged: resumed run exit $JOB_RC"; }
# Each rank verifies only the parts it restores: rank 3 (whose part is
# damaged) moves step 60 aside; a rank that restored step 60 before that is
# refused at the join and the group restarts. Every incarnation that trained
# restored step 50 on all four ranks, and nothing restored step 60 twice.
ls -d "$D"/ck/step-0000000060.corrupt-* >/dev/null 2>&1 || fail "damaged: step 60 was not moved aside"
trained=$(count_events "$D/events.jsonl" "e['event']=='first_step'")
[ "$trained" -eq 4 ] || fail "damaged: $trained first steps (one group of four expected to train)"
last=$(events "$D/events.jsonl" "e['event']=='first_step'" | "$PY" -c 'import json,sys; print(json.loads(sys.stdin.readline())["incarnation"])')
[ "$(count_events "$D/events.jsonl" "e['event']=='restored' and e['incarnation']==$last and e['step']==50")" -eq 4 ] ||
  fail "damaged: the group that trained did not restore step 50 on all four ranks"
[ "$(json "$D/out.json" steps_done)" -eq 70 ] || fail "damaged: steps_done != 70 after the fallback"
pass "a damaged part of rank 3: step 60 moved aside by the rank that reads it, step 50 restored by all, every step once"

# 4 -> 2 -> 4 workers, and the same with a SIGTERM during the 2-worker phase.
resize_run() { # resize_run DIR [fault]
  local d=$1 fault=${2:-}
  start_job "$d" 4 -- --steps 40 --step-delay-ms 8 --save-every 10 --shard-optimizer
  wait_job
  [ "$JOB_RC" -eq 0 ] || fail "$d: 4-worker phase exit $JOB_RC"
  # Slower steps here: the SIGTERM must land before this phase ends, also
  # on a loaded machine (30 steps of 20 ms after the save it waits for).
  start_job "$d" 2 -- --steps 80 --step-delay-ms 20 --save-every 10 --shard-optimizer
  if [ -n "$fault" ]; then
    wait_for_save "$d" 50
    kill -TERM "$(workers_of "$JOB_PID" | sort | tail -1)"
  fi
  wait_job
  [ "$JOB_RC" -eq 0 ] || { tail -20 "$d/log.txt"; fail "$d: 2-worker phase exit $JOB_RC"; }
  [ "$(json "$d/out.json" world_size)" -eq 2 ] || fail "$d: the 2-worker phase did not run on 2"
  start_job "$d" 4 -- --steps $STEPS --step-delay-ms 8 --save-every 10 --shard-optimizer
  wait_job
  [ "$JOB_RC" -eq 0 ] || fail "$d: last 4-worker phase exit $JOB_RC"
  [ "$(json "$d/out.json" steps_done)" -eq $STEPS ] || fail "$d: steps_done != $STEPS across the size changes"
  [ "$(json "$d/out.json" step_index_sum)" -eq $((STEPS * (STEPS + 1) / 2)) ] || fail "$d: a step ran twice or never"
  restores=$(events "$d/events.jsonl" "e['event']=='restored'" | "$PY" -c 'import json,sys; print(" ".join(str(json.loads(l)["step"]) for l in sys.stdin))')
  echo "$restores"
}
R1=$(resize_run "$WORK/resize-ref" | tail -1)
[ "$R1" = "40 40 80 80 80 80" ] || fail "4 -> 2 -> 4: restored steps '$R1', expected every rank at 40, then at 80"
R2=$(resize_run "$WORK/resize-term" fault | tail -1)
[ "$(json "$WORK/resize-term/out.json" weights_checksum)" = "$(json "$WORK/resize-ref/out.json" weights_checksum)" ] ||
  fail "4 -> 2 -> 4 with a SIGTERM: final weights differ from the same size changes without a fault"
pass "4 -> 2 -> 4 workers: resumed at 40 and 80 (restores: $R2), every sample once, a SIGTERM at 2 workers changes nothing"

# The format needs no Grace to read: the reference reader assembles what
# grace-ckpt export writes.
step_dir=$(ls -d "$WORK/resize-ref/ck/step-"* | tail -1)
"$GRACE_CKPT" export "$step_dir" "$WORK/export.safetensors" >/dev/null
"$PY" "$ASSEMBLE" "$step_dir" >"$WORK/assembled.txt"
"$PY" "$ASSEMBLE" "$WORK/export.safetensors" >"$WORK/exported.txt"
diff "$WORK/assembled.txt" "$WORK/exported.txt" >/dev/null || fail "assembled tensors differ from grace-ckpt export"
grep -q "^optimizer.momentum F32 " "$WORK/assembled.txt" || fail "no sharded tensor assembled"
pass "assemble_sharded.py (no Grace) reads the same tensors as grace-ckpt export"
