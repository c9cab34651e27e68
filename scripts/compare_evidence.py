#!/usr/bin/env python3
"""Compare the evidence of two folders of receipts made by two builds of the same plan.

Usage: compare_evidence.py LABEL OLD_DIR NEW_DIR

Each receipt's `evidence` less `build` (the stamp names the build) and `performance` (timings) is
compared as canonical JSON (gate details apart: they are prose, counted but not failed on), receipt by receipt (paired by path, which holds the run id). Prints one
line and exits 1 when any receipt differs or is missing on either side, 0 otherwise.
"""
import glob
import json
import os
import sys


def evidence(folder):
    out = {}
    for f in glob.glob(os.path.join(folder, "**", "run-*.json"), recursive=True):
        e = json.load(open(f))["evidence"]
        e.pop("build", None)
        e.pop("performance", None)
        # A gate's detail is prose written by the gates crate; the runtime's evidence is the
        # rest. Kept apart so a reworded detail reads as what it is.
        details = [g.pop("detail", None) for g in e.get("gates", [])]
        out[os.path.relpath(f, folder)] = (json.dumps(e, sort_keys=True), details)
    return out


def paths(a, b, at="", out=None):
    """The JSON paths where `a` and `b` differ (first 8), with both values cut short."""
    out = [] if out is None else out
    if len(out) >= 8:
        return out
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            paths(a.get(k), b.get(k), f"{at}.{k}", out)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            paths(x, y, f"{at}[{i}]", out)
    elif a != b:
        out.append(f"{at}: {json.dumps(a)[:80]} -> {json.dumps(b)[:80]}")
    return out


def main():
    label, old_dir, new_dir = sys.argv[1:4]
    a, b = evidence(old_dir), evidence(new_dir)
    differ = sorted(k for k in a if k in b and a[k][0] != b[k][0])
    worded = sorted(k for k in a if k in b and a[k][0] == b[k][0] and a[k][1] != b[k][1])
    only = sorted(set(a) ^ set(b))
    print(f"{label}: old {len(a)} receipts, new {len(b)}, paired {len(set(a) & set(b))}, "
          f"evidence differs in {len(differ)}, unpaired {len(only)} {(differ + only)[:3]}; "
          f"only a gate's detail wording differs in {len(worded)}")
    for k in differ[:2]:
        for line in paths(json.loads(a[k][0]), json.loads(b[k][0])):
            print(f"  {k}{line}")
    sys.exit(1 if differ or only or not a else 0)


if __name__ == "__main__":
    main()
