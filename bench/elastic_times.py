# Shrink and growth times of elastic grace-chaos runs, from their events:
#   python3 elastic_times.py RUN_DIR...
import json, statistics, sys
shrink, grow = [], []
for d in sys.argv[1:]:
    ev = sorted((json.loads(l) for l in open(d + "/events.jsonl") if l.startswith("{")), key=lambda e: e["t_ns"])
    world = {e["incarnation"]: e["world_size"] for e in ev if e["event"] == "group_formed"}
    def all_stepping(inc):
        fs = [e["t_ns"] for e in ev if e["event"] == "first_step" and e["incarnation"] == inc]
        return max(fs) if fs else None
    for f in (e for e in ev if e["event"] == "chaos_fault" and e["fault"].startswith("host")):
        later = [i for i in sorted(world) if i > f["incarnation"]]
        if later and world[later[0]] < world.get(f["incarnation"], 0) and all_stepping(later[0]):
            shrink.append((all_stepping(later[0]) - f["t_ns"]) / 1e6)
    for g in (e for e in ev if e["event"] == "grow"):
        later = [i for i in sorted(world) if i > g["incarnation"]]
        if later and all_stepping(later[0]):
            grow.append((all_stepping(later[0]) - g["t_ns"]) / 1e6)
for name, xs in (("host lost -> every rank of the smaller group stepping", shrink),
                 ("newcomer's request -> every rank of the grown group stepping", grow)):
    if xs:
        print(f"{name}: median {statistics.median(xs):.0f} ms, {min(xs):.0f}-{max(xs):.0f} ms over {len(xs)}")
