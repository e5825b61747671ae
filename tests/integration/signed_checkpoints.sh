#!/usr/bin/env bash
# Signed checkpoints (runtime/checkpoint/signing.hpp), real processes:
#  - bad key files and flag mixes are a clear error (exit 2);
#  - a job with a token file signs its steps with the key derived from it;
#  - steps planted in its directory (unsigned, signed with another job's
#    key, signed and then changed) are refused by grace-ckpt verify with
#    the reason, skipped and set aside on restore: the job resumes from its
#    own newest step and ends bit-identical to an uninterrupted run;
#  - `grace-ckpt sign` adopts steps written unsigned, which a job with a
#    long-lived key file then restores.
source "$(dirname "$0")/lib.sh"
command -v openssl > /dev/null || fail "the openssl command is missing (apt-get install openssl)"

K=$WORK/keys
mkdir -p "$K"
openssl rand -hex 16 > "$K/token"
openssl rand -hex 16 > "$K/other-token"
openssl rand -hex 32 > "$K/key"
cp "$K/key" "$K/open-key"
printf 'too-short-a-key\n' > "$K/short-key"
chmod 600 "$K"/*
chmod 644 "$K/open-key"

bad() { # bad EXPECTED-TEXT LAUNCH-ARGS...
  local want=$1 out rc
  shift
  set +e
  out=$(timeout 20 "$GRACE_LAUNCH" --nproc 1 --checkpoint-dir "$WORK/bad-ck" "$@" -- "$GRACE_TRAIN" --device cpu --steps 1 2>&1)
  rc=$?
  set -e
  [ $rc -eq 2 ] || { echo "$out"; fail "launch with $* exited $rc, expected 2"; }
  grep -q -- "$want" <<< "$out" || { echo "$out"; fail "launch with $*: the error must say [$want]"; }
}
bad "chmod 600" --checkpoint-key-file "$K/open-key"
bad "at least 32" --checkpoint-key-file "$K/short-key"
bad "give one of them" --checkpoint-key-file "$K/key" --checkpoint-signing off
bad "checkpoint-signing" --checkpoint-signing sometimes
[ ! -e "$WORK/bad-ck" ] || [ -z "$(ls -A "$WORK/bad-ck")" ] || fail "a refused launch wrote checkpoints"
pass "bad key files and flags: exit 2 naming the fault, nothing written"

REF=$(reference 2 --steps 60 --save-every 10)

# run DIR LAUNCH-ARGS -- TRAIN-ARGS: one job to its end in DIR (sets JOB_RC)
run() {
  local dir=$1 largs=()
  shift
  while [ "$1" != "--" ]; do largs+=("$1"); shift; done
  shift
  mkdir -p "$dir"
  set +e
  (cd "$dir" && timeout 120 "$GRACE_LAUNCH" --nproc 2 --checkpoint-dir ck "${largs[@]}" -- \
      "$GRACE_TRAIN" --device cpu --output out.json --save-every 10 --keep-checkpoints "$@" >> log.txt 2>&1)
  JOB_RC=$?
  set -e
}

J=$WORK/job
run "$J" --token-file "$K/token" -- --steps 30
[ "$JOB_RC" -eq 0 ] || { tail -20 "$J/log.txt"; fail "the first 30 steps: exit $JOB_RC"; }
grep -q "checkpoints are signed with key" "$J/log.txt" || fail "the launcher did not say the checkpoints are signed"
out=$("$GRACE_CKPT" verify "$J/ck" --token-file "$K/token") || { echo "$out"; fail "the job's own steps do not verify with its key"; }
[ "$(grep -c 'OK (signed with key' <<< "$out")" -eq 3 ] || { echo "$out"; fail "expected steps 10, 20, 30 signed"; }
pass "a job with a token file signs its steps with the key derived from it"

# Plant three steps newer than 30, each a copy of step 30 with valid checksums.
plant() { # plant STEP
  local d=$J/ck/step-$(printf '%010d' "$1")
  cp -r "$J/ck/step-0000000030" "$d"
  "$PY" - "$d/grace-manifest.json" "$1" <<'PYEOF'
import json, sys
p, step = sys.argv[1], int(sys.argv[2])
m = json.load(open(p))
m["step"] = step
json.dump(m, open(p, "w"), indent=2)
PYEOF
}
plant 40 && "$GRACE_CKPT" sign "$J/ck" --step 40 --token-file "$K/other-token" --force > /dev/null
plant 45 && "$GRACE_CKPT" sign "$J/ck" --step 45 --token-file "$K/token" --force > /dev/null
"$PY" - "$J/ck/step-0000000045/grace-manifest.json" <<'PYEOF'
import json, sys
m = json.load(open(sys.argv[1]))
m["counters"]["steps_done"] = 45   # a change after signing
json.dump(m, open(sys.argv[1], "w"), indent=2)
PYEOF
plant 50
"$PY" - "$J/ck/step-0000000050/grace-manifest.json" <<'PYEOF'
import json, sys
m = json.load(open(sys.argv[1]))
del m["signature"]
json.dump(m, open(sys.argv[1], "w"), indent=2)
PYEOF
set +e
out=$("$GRACE_CKPT" verify "$J/ck" --token-file "$K/token")
rc=$?
set -e
[ $rc -eq 1 ] || { echo "$out"; fail "verify with the job's key exited $rc over planted steps, expected 1"; }
grep -q "step 40: INVALID.*signed with another key" <<< "$out" || { echo "$out"; fail "step 40 (another key) not named"; }
grep -q "step 45: INVALID.*does not match" <<< "$out" || { echo "$out"; fail "step 45 (changed after signing) not named"; }
grep -q "step 50: INVALID.*unsigned" <<< "$out" || { echo "$out"; fail "step 50 (unsigned) not named"; }
"$GRACE_CKPT" verify "$J/ck" > /dev/null || fail "without a key the planted steps' checksums must still verify (readers without Grace)"
pass "grace-ckpt verify names each planted step and why"

run "$J" --token-file "$K/token" -- --steps 60
check_finished "$J" 60 "$REF"
grep -q "restored step 30 from" "$J/log.txt" || { tail -30 "$J/log.txt"; fail "the job did not resume from its own step 30"; }
for s in 40 45 50; do
  grep -q "skipped checkpoint .*step-00000000$s" "$J/log.txt" || fail "restore did not name planted step $s"
  [ -n "$(find "$J/ck" -maxdepth 1 -name "step-00000000$s.corrupt-*")" ] || fail "planted step $s was not set aside"
done
"$GRACE_CKPT" verify "$J/ck" --token-file "$K/token" --step 60 | grep -q "OK (signed with key" || fail "step 60 is not signed"
pass "planted steps skipped and set aside; the job resumed from step 30 and ended identical to the uninterrupted run"

# Unsigned steps, adopted with grace-ckpt sign, restore under a key file.
U=$WORK/unsigned
run "$U" --checkpoint-signing off -- --steps 20
[ "$JOB_RC" -eq 0 ] || { tail -20 "$U/log.txt"; fail "the unsigned job: exit $JOB_RC"; }
"$GRACE_CKPT" verify "$U/ck" | grep -q "step 20: OK (unsigned)" || fail "the unsigned job's step 20 is not reported unsigned"
out=$("$GRACE_CKPT" sign "$U/ck" --key-file "$K/key") || { echo "$out"; fail "grace-ckpt sign failed"; }
grep -q "2 signed, 0 not signed" <<< "$out" || { echo "$out"; fail "sign did not sign steps 10 and 20"; }
run "$U" --checkpoint-key-file "$K/key" -- --steps 60
check_finished "$U" 60 "$REF"
grep -q "restored step 20 from" "$U/log.txt" || { tail -30 "$U/log.txt"; fail "the key-file job did not restore the adopted step 20"; }
pass "grace-ckpt sign adopts unsigned steps; a job with the key file restores them"
