#!/usr/bin/env bash
# scripts/check_layers.py fails on each kind of include against the layer
# order, in a scratch tree, and passes the same tree without it.
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
mkdir -p "$tree"/runtime/{base,checkpoint,worker} "$tree"/messages "$tree"/actors
echo '#pragma once' >"$tree/runtime/base/error.hpp"
echo '#include "runtime/base/error.hpp"' >"$tree/runtime/checkpoint/store.hpp"
echo '#include "runtime/checkpoint/store.hpp"' >"$tree/runtime/worker/policy.hpp"
echo '#include "runtime/worker/policy.hpp"' >"$tree/actors/host.cpp"
echo '#include "runtime/base/error.hpp"' >"$tree/messages/wire.hpp"
python3 "$src/scripts/check_layers.py" "$tree" >/dev/null || { echo "FAIL: a tree whose includes point down was refused"; exit 1; }

# expect_refused FILE LINE WORDS: FILE gets LINE; the check must fail naming WORDS.
expect_refused() {
  local file=$1 line=$2 words=$3 out
  cp "$tree/$file" "$tree/$file.keep"
  echo "$line" >>"$tree/$file"
  if out=$(python3 "$src/scripts/check_layers.py" "$tree"); then
    echo "FAIL: $file with '$line' passed the layer check"; exit 1
  fi
  grep -F -- "$words" <<<"$out" >/dev/null || { echo "FAIL: the refusal does not say '$words': $out"; exit 1; }
  mv "$tree/$file.keep" "$tree/$file"
  echo "PASS: refused $file including $line"
}
expect_refused runtime/checkpoint/store.hpp '#include "runtime/worker/policy.hpp"' "runtime/worker (floor 4) is not below runtime/checkpoint"
expect_refused runtime/base/error.hpp '#include "actors/host.hpp"' "includes \"actors/host.hpp\": runtime/ includes only runtime/"
expect_refused runtime/worker/policy.hpp '#include <caf/actor.hpp>' "runtime/ stays free of CAF"
expect_refused actors/host.cpp '#include "apps/chaos/runner.hpp"' "apps (floor 7) is not below actors"
expect_refused messages/wire.hpp '#include "runtime/checkpoint/store.hpp"' "runtime/checkpoint (floor 2) is not below messages"
expect_refused runtime/checkpoint/store.hpp '#include "messages/wire.hpp"' "runtime/ includes only runtime/"
echo "PASS: every kind of upward include is refused"
