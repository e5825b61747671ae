#!/usr/bin/env python3
"""Checks a job's events after a notice with a grace period.

    check_grace.py EVENTS GRACE_MS [--workers N] [--min-gap STEPS] [--commits N]

Incarnation 0 must hold an initial agreement, training on after it, then a
final save proposed by the chief and committed before the deadline; every
worker exits 42 and the restart restores that last save.

One outcome besides "final" is correct: on a loaded machine the chief's final
round may still be open when the coordination service's rescue timer fires
(deadline minus about half a step, 1.5 saves and 10 ms), and the service then
saves the same boundary just in time. That is accepted only when the chief did
propose the final save and a `rescue` event follows that proposal; a jit round
without both is a failure. Used by tests/integration/grace_period.sh and
tests/python/pytorch_faults.sh. Prints one summary line, or the failed check
with exit 1.
"""
import argparse
import json
import sys


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def check(ev, grace_ms, workers=None, min_gap=1, commits=None):
    inc0 = [e for e in ev if e.get("incarnation") == 0]
    claim = next((e for e in inc0 if e["event"] == "claim"), None)
    assert claim is not None, "no claim of the notice in incarnation 0"
    agreed = [e for e in inc0 if e["event"] == "agreed"]
    kinds = [a["kind"] for a in agreed]
    assert len(kinds) == 2 and kinds[0] == "initial" and kinds[1] in ("final", "jit"), \
        f"expected an initial then a final agreement, got {kinds}"
    proposals = [e for e in inc0 if e["event"] == "propose_final"]
    assert proposals, "the final save was never proposed"
    how = "final save"
    if kinds[1] == "jit":
        rescues = [e for e in inc0 if e["event"] == "rescue" and e["t_ns"] >= proposals[0]["t_ns"]]
        assert rescues and rescues[0]["t_ns"] <= agreed[1]["t_ns"], \
            "a just-in-time round replaced the final save with no rescue of the proposed final round"
        how = "final save (rescued by the service)"
    first, final = agreed[0]["step"], agreed[1]["step"]
    assert final >= first + min_gap, f"training must continue between the saves ({first} -> {final})"
    done = [e for e in inc0 if e["event"] == "committed"]
    if commits is not None:
        assert len(done) == commits, f"expected {commits} commits, got {len(done)}"
    assert done, "nothing committed in incarnation 0"
    last = done[-1]
    assert last["step"] == final, f"the last commit is step {last['step']}, the final save was {final}"
    deadline = claim["t_ns"] + grace_ms * 1_000_000
    assert last["t_ns"] <= deadline, f"final save {(last['t_ns'] - deadline) / 1e6:.0f} ms after the deadline"
    exits = [e for e in inc0 if e["event"] == "exit"]
    assert exits and all(e["code"] == 42 for e in exits), "every worker exits 42 after the final save"
    if workers is not None:
        assert len(exits) == workers, f"expected {workers} worker exits, got {len(exits)}"
    restored = next((e for e in ev if e["event"] == "restored"), None)
    assert restored is not None, "the restart restored nothing"
    assert restored["step"] == final, f"restored {restored['step']}, the final save was {final}"
    return (f"initial save at step {first}, {how} at step {final}, "
            f"{(deadline - last['t_ns']) / 1e6:.0f} ms before the deadline")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("events")
    ap.add_argument("grace_ms", type=int)
    ap.add_argument("--workers", type=int)
    ap.add_argument("--min-gap", type=int, default=1)
    ap.add_argument("--commits", type=int)
    a = ap.parse_args()
    try:
        print(check(load(a.events), a.grace_ms, a.workers, a.min_gap, a.commits))
    except (AssertionError, KeyError, OSError, ValueError) as e:
        print(str(e) if isinstance(e, AssertionError) else f"{type(e).__name__}: {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
