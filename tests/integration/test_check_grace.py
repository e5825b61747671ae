#!/usr/bin/env python3
"""check_grace.py's rules on made-up event streams: the outcomes it must
accept and the ones it must refuse."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_grace import check  # noqa: E402

MS = 1_000_000


def job(second="final", propose=True, rescue=False, final_at=900, restored=40):
    ev = [{"incarnation": 0, "event": "claim", "t_ns": 0},
          {"incarnation": 0, "event": "agreed", "kind": "initial", "step": 10, "t_ns": 5 * MS},
          {"incarnation": 0, "event": "committed", "step": 10, "t_ns": 20 * MS}]
    if propose:
        ev.append({"incarnation": 0, "event": "propose_final", "step": 40, "t_ns": 700 * MS})
    if rescue:
        ev.append({"incarnation": 0, "event": "rescue", "t_ns": 800 * MS})
    ev += [{"incarnation": 0, "event": "agreed", "kind": second, "step": 40, "t_ns": 810 * MS},
           {"incarnation": 0, "event": "committed", "step": 40, "t_ns": final_at * MS}]
    ev += [{"incarnation": 0, "event": "exit", "code": 42, "t_ns": 950 * MS} for _ in range(4)]
    ev.append({"incarnation": 1, "event": "restored", "step": restored, "t_ns": 1200 * MS})
    return ev


def refused(ev, why, **kw):
    try:
        check(ev, 1000, **kw)
    except AssertionError as e:
        assert why in str(e), f"refused for another reason: {e}"
        return
    raise AssertionError(f"accepted a run that must fail ({why})")


def main():
    assert "final save at step 40" in check(job(), 1000, workers=4, commits=2)
    assert "rescued by the service" in check(job("jit", rescue=True), 1000, workers=4, commits=2)
    refused(job("jit"), "no rescue")
    refused(job("jit", propose=False, rescue=True), "never proposed")
    refused(job(propose=False), "never proposed")
    refused(job(final_at=1100), "after the deadline")
    refused(job(restored=10), "restored 10")
    refused(job(), "expected 3 worker exits", workers=3)
    refused(job(), "training must continue", min_gap=31)
    print("check_grace: 9 cases passed")


if __name__ == "__main__":
    main()
