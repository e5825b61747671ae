#!/usr/bin/env python3
"""Waits until event files hold enough events matching an expression.

    wait_events.py --expr EXPR [--count N] [--timeout S] [--pid PID] FILE...

EXPR is a Python expression on `e` (one event, a dict). Exits 0 once at
least N (default 1) events of the files match, 1 after S seconds (default
60), 2 when the process PID is gone before that (the job ended while we
waited). One process polls every 50 ms and reads only what each file grew
by, instead of a shell loop that starts an interpreter and re-reads every
file twenty times a second (which cost the suite a core while it waited).
Files may not exist yet; they are append-only JSON lines (runtime/events).
"""
import argparse
import json
import os
import sys
import time


class tail:
    """Reads the complete lines appended to one file since the last call."""

    def __init__(self, path):
        self.path, self.offset, self.partial = path, 0, b""

    def new_events(self):
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(data)
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--expr", required=True)
    ap.add_argument("--count", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=60)
    ap.add_argument("--pid", type=int, default=0)
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()
    test = compile(a.expr, "<expr>", "eval")
    tails = [tail(p) for p in a.files]
    seen = 0
    end = time.monotonic() + a.timeout
    while True:
        for t in tails:
            seen += sum(safe_eval(test, e) for e in t.new_events())
        if seen >= a.count:
            return 0
        if a.pid and not pid_alive(a.pid):
            # One more read: the events of its last moments may be in now.
            seen += sum(safe_eval(test, e) for t in tails for e in t.new_events())
            return 0 if seen >= a.count else 2
        if time.monotonic() >= end:
            return 1
        time.sleep(0.05)


def safe_eval(test, e):
    try:
        return bool(eval(test, {}, {"e": e}))
    except (KeyError, TypeError):
        return False


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not yet reaped by its parent shell) counts as gone.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


if __name__ == "__main__":
    sys.exit(main())
