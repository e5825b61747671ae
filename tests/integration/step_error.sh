#!/usr/bin/env bash
# An error raised inside a step: the error reaches every worker and every
# worker exits 3 - no SIGSEGV in teardown (abort handler racing the
# communicator's destruction), no hang in a collective (launcher kill after
# its fatal timeout shows as signal 9) - and the launcher exits 3 without a
# restart. Several ranks and steps, since both defects were races.
source "$(dirname "$0")/lib.sh"
ARGS=(--device cpu --steps 200 --step-delay-ms 5)

n=0
for spec in "40 2" "41 0" "17 3" "60 1" "23 2" "5 0"; do
  set -- $spec
  step=$1 rank=$2
  D="$WORK/err-$step-$rank"
  start_job "$D" 4 -- "${ARGS[@]}" --fail-at-step "$step" --fail-rank "$rank"
  wait_job
  [ "$JOB_RC" -eq 3 ] || { tail -30 "$D/log.txt"; fail "step $step rank $rank: launcher exit $JOB_RC, expected 3"; }
  [ "$(json "$D/ck/grace-exit.json" restarts)" -eq 0 ] || fail "a bug must not be restarted"
  exits=$(count_events "$D/events.jsonl" "e['event']=='worker_exit'")
  threes=$(count_events "$D/events.jsonl" "e['event']=='worker_exit' and e['code']==3 and e['signal']==0")
  [ "$exits" -eq 4 ] && [ "$threes" -eq 4 ] \
    || { grep '"worker_exit"\|"exit"' "$D/events.jsonl"; tail -30 "$D/log.txt"; fail "step $step rank $rank: every worker must exit 3 (no signal)"; }
  [ "$(count_events "$D/events.jsonl" "e['event']=='exit' and e['code']==3 and 'rank $rank' in e['reason'] and 'step $step' in e['reason']")" -eq 4 ] \
    || { grep '"exit"' "$D/events.jsonl"; fail "step $step rank $rank: every worker must name the origin"; }
  ! grep -q "did not exit in time" "$D/log.txt" || fail "step $step rank $rank: a worker hung and was killed"
  [ "$(count_events "$D/events.jsonl" "e['event']=='exit_timeout'")" -eq 0 ] || fail "step $step rank $rank: the launcher's exit timeout fired (a worker hung)"
  n=$((n + 1))
done
pass "$n step errors: every worker exited 3, the launcher exited 3, no restart, no signal, no hang"
