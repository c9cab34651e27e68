#!/usr/bin/env python3
"""Compare the evidence of two folders of receipts made by two builds of the same plan.

Usage: compare_evidence.py LABEL OLD_DIR NEW_DIR

Each receipt's `evidence` less `build` (the stamp names the build) and `performance` (timings) is
compared as canonical JSON, receipt by receipt (paired by path, which holds the run id). Prints one
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
        out[os.path.relpath(f, folder)] = json.dumps(e, sort_keys=True)
    return out


def main():
    label, old_dir, new_dir = sys.argv[1:4]
    a, b = evidence(old_dir), evidence(new_dir)
    differ = sorted(k for k in a if k in b and a[k] != b[k])
    only = sorted(set(a) ^ set(b))
    print(f"{label}: old {len(a)} receipts, new {len(b)}, paired {len(set(a) & set(b))}, "
          f"evidence differs in {len(differ)}, unpaired {len(only)} {(differ + only)[:3]}")
    sys.exit(1 if differ or only or not a else 0)


if __name__ == "__main__":
    main()
