#!/usr/bin/env python3
"""Holds every #include of Grace's sources to the layer order.

    python3 scripts/check_layers.py [ROOT]

Each folder has a floor (FLOORS below, docs/ARCHITECTURE.md "Layers"). A
file may include files of its own folder and of folders on lower floors,
never of a folder on its own floor or above, so imports only point down and
no two folders import each other. runtime/ includes no CAF header (<caf/...>)
and nothing of messages/ or actors/. Prints every violation with its file and
line and exits 1; exits 0 with a one-line summary when there is none.
"""
import os
import re
import sys

# Folder -> floor. A folder not named here takes the floor of its nearest
# named parent (runtime/train/cuda is train's).
FLOORS = {
    "runtime/base": 0,
    "runtime/net": 1,
    "runtime/launch": 1,
    "runtime/ops": 1,
    "runtime/checkpoint": 2,
    "runtime/coordination": 3,
    "runtime/worker": 4,
    "runtime/train": 5,
    "messages": 1,
    "actors": 6,
    "apps": 7,
    "python": 7,
    "bench": 7,
    "examples": 7,
}
SOURCES = (".hpp", ".cpp", ".h", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


def folder_of(path):
    """The FLOORS key a repository path belongs to, or None."""
    best = None
    for f in FLOORS:
        if (path == f or path.startswith(f + "/")) and (best is None or len(f) > len(best)):
            best = f
    return best


def violations(root):
    """Yields (file, line, message) for every include against the order."""
    for top in sorted({f.split("/")[0] for f in FLOORS}):
        for dirpath, _, names in os.walk(os.path.join(root, top)):
            for name in sorted(names):
                if not name.endswith(SOURCES):
                    continue
                path = os.path.relpath(os.path.join(dirpath, name), root)
                yield from check_file(root, path)


def check_file(root, path):
    here = folder_of(path)
    if here is None:
        return
    with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            kind, target = m.groups()
            if kind == "<":
                if here.startswith("runtime/") and target.startswith("caf/"):
                    yield path, n, f"includes <{target}>: runtime/ stays free of CAF"
                continue
            there = folder_of(target)
            if there is None or there == here:
                continue
            if here.startswith("runtime/") and not there.startswith("runtime/"):
                yield path, n, f'includes "{target}": runtime/ includes only runtime/'
                continue
            if FLOORS[there] >= FLOORS[here]:
                yield path, n, (f'includes "{target}": {there} (floor {FLOORS[there]}) is not below '
                                f"{here} (floor {FLOORS[here]})")


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    found = list(violations(root))
    for path, n, msg in found:
        print(f"{path}:{n}: {msg}")
    if found:
        print(f"check_layers: {len(found)} include(s) against the layer order (scripts/check_layers.py)")
        return 1
    print(f"check_layers: every include of {', '.join(sorted({k.split('/')[0] for k in FLOORS}))} points down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
