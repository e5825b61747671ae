#!/usr/bin/env bash
# Regenerates the fuzzers' seed corpora in tests/fuzz/corpus/ from a build:
# framed messages (fuzz_message_seeds), a real checkpoint written by
# grace-train (manifest, shard, index), configuration strings.
#   bash tests/fuzz/make_corpus.sh build
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
B=$(cd "${1:?usage: $0 BUILD_DIR}" && pwd)
C="$HERE/corpus"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
rm -rf "$C"
mkdir -p "$C"/{messages,safetensors,manifest,config,checkpoint}
"$B/tests/fuzz/fuzz_message_seeds" "$C/messages"
(cd "$T" && "$B/grace-train" --steps 3 --hidden 8 --save-every 3 --keep-checkpoints --checkpoint-dir ck >/dev/null 2>&1)
step=$(ls -d "$T"/ck/step-* | tail -1)
cp "$step/model-00001-of-00001.safetensors" "$C/safetensors/model"
cp "$step/grace-manifest.json" "$C/manifest/manifest"
printf '%s\n@@@@\n' "$(cat "$step/grace-manifest.json")" > "$C/checkpoint/step"
cat "$step/model-00001-of-00001.safetensors" >> "$C/checkpoint/step"
printf '\n@@@@\n%s' "$(cat "$step/model.safetensors.index.json")" >> "$C/checkpoint/step"
# config: the first byte picks the parser (fuzz_config.cpp)
printf '\x00{"cluster":{"worker":["10.0.0.1:2222","10.0.0.2:2222"]},"task":{"type":"worker","index":1}}' > "$C/config/tf_config"
printf '\x01node-3.example:29400' > "$C/config/host_port"
printf '\x02127.0.0.1:5000,127.0.0.1:5001' > "$C/config/workers"
printf '\x03gpu[01-04,07],cpu9' > "$C/config/nodelist"
printf '\x04MASTER_ADDR=10.1.1.1\nMASTER_PORT=29500\nWORLD_SIZE=8\nSLURM_JOB_NODELIST=n[1-2]\nSLURM_NNODES=2\nSLURM_NODEID=1' > "$C/config/env"
printf '\x05step-0000000042' > "$C/config/names"
# gate: the first byte picks the target (fuzz_gate.cpp); a passing handshake
# for the harness's fixed secret and nonces, garbage, a signed manifest.
mkdir -p "$C/gate"
python3 - "$C/gate" <<'PYEOF'
import hashlib, hmac, json, sys
out = sys.argv[1]
K = hmac.new(b"fuzz-job-secret-0123", b"grace bulk channel v2", hashlib.sha256).digest()
nc, ns, kind = b"c" * 16, b"s" * 16, 2
proof = hmac.new(K, b"client\0" + bytes([kind]) + nc + ns, hashlib.sha256).digest()
open(out + "/handshake_pass", "wb").write(bytes([0x0e]) + b"GRBK" + bytes([2, kind]) + nc + proof)  # server speaks first
open(out + "/handshake_garbage", "wb").write(b"\x00GET / HTTP/1.0\r\n\r\n")
m = {"format": "grace-checkpoint", "step": 3, "files": [{"name": "model.safetensors", "size": 10, "xxh3": "00"}]}
key = b"f" * 32
mac = hmac.new(key, json.dumps(m, separators=(",", ":"), sort_keys=True).encode(), hashlib.sha256).hexdigest()
m["signature"] = {"algorithm": "HMAC-SHA256", "key_id": hashlib.sha256(b"grace checkpoint key id\n" + key).hexdigest()[:16],
                  "mac": mac}
open(out + "/signed_manifest", "wb").write(b"\x01" + json.dumps(m, indent=2).encode())
PYEOF
echo "corpus written to $C: $(find "$C" -type f | wc -l) files"
