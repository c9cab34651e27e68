#!/usr/bin/env python3
"""Wall time per configuration by lane (backend, TP, transport, pass shape) from a run's receipts:
   python3 scripts/gpu/lane_costs.py DIR...
What a part of `run --worker-processes N` costs depends on its lanes (a TP8 run drives 8 ranks'
launches); this prints each lane's configurations, mean and median wall (ms, each configuration's
receipt `measurements.wall_ms`: its two runs and the census baselines it ran) and the mean relative
to TP1 host-bounce single-token."""
import json, os, statistics, sys

lanes = {}
for d in sys.argv[1:]:
    for f in sorted(os.listdir(d)):
        if not (f.startswith("run-") and f.endswith(".json")):
            continue
        r = json.load(open(os.path.join(d, f)))
        c = r["evidence"]["config"]
        if r["evidence"]["verdict"] in ("NOT-APPLICABLE", "SKIP"):
            continue
        key = (c.get("backend", "?"), c["tp"], c["transport"], c.get("batch") or 1, c.get("columns") or 1)
        lanes.setdefault(key, []).append(r["measurements"]["wall_ms"])
base = None
for k in sorted(lanes):
    if k[1] == 1 and k[2] == "host-bounce" and k[3:] == (1, 1):
        base = statistics.mean(lanes[k])
print(f"{'lane':40} {'configs':>7} {'mean ms':>9} {'median ms':>9} {'÷ tp1 hb':>8}")
for k in sorted(lanes):
    v = lanes[k]
    m = statistics.mean(v)
    rel = f"{m / base:8.2f}" if base else "       -"
    name = f"{k[0]} tp{k[1]} {k[2]} b{k[3]} t{k[4]}"
    print(f"{name:40} {len(v):7} {m:9.1f} {statistics.median(v):9.1f} {rel}")
