#!/usr/bin/env python3
"""report.md of one night of scripts/nightly.sh, from the night's folder alone.

Everything in the report is read from what the night left: the step statuses nightly.sh recorded
(logs/steps.tsv), the receipts (verdict counts, the configurations that did not pass, the phase
times each receipt carries in measurements.extra.phase_*_ms), the diff outputs (regressions) and
the promote tables (promotable doors). Nothing is recomputed or judged again here: a verdict is
the receipt's, a regression is diff's, a promotion is promote's. Standard library only.
"""

import argparse
import glob
import json
import os
import sys

VERDICTS = ["PASS", "FAIL", "VOID", "SKIP", "NOT-APPLICABLE", "ERROR"]
PHASES = ["upload", "oracle", "run", "probe", "gates"]


def receipts(d):
    """The receipts of directory d (flat, as memra-gates reads a directory), by file name."""
    out = []
    for f in sorted(glob.glob(os.path.join(d, "run-*.json"))):
        try:
            with open(f) as fh:
                out.append((f, json.load(fh)))
        except (OSError, ValueError) as e:
            out.append((f, {"unreadable": str(e)}))
    return out


def verdict(r):
    v = r.get("evidence", {}).get("verdict", "?")
    return str(v).upper().replace("_", "-")


def label(r):
    c = r.get("evidence", {}).get("config", {})
    doors = sorted(k for k, on in c.get("doors", {}).items() if on)
    return f"{c.get('backend', '?')} tp{c.get('tp', '?')} {c.get('transport', '?')} {'+'.join(doors) or 'defaults'}"


def model(rs):
    ms = sorted({f"{r['evidence']['config']['model']['preset']} {r['evidence']['config']['model']['digest']}"
                 for _, r in rs if "evidence" in r and "config" in r["evidence"]})
    return ", ".join(ms) or "-"


def clock(ms):
    s = round(ms / 1000)
    h, m, sec = s // 3600, s // 60 % 60, s % 60
    return f"{h}h{m:02d}m{sec:02d}s" if h else (f"{m}m{sec:02d}s" if m else f"{ms / 1000:.1f}s")


def read_steps(night):
    path = os.path.join(night, "logs", "steps.tsv")
    rows = []
    if os.path.exists(path):
        with open(path) as fh:
            for line in fh.read().splitlines()[1:]:
                parts = line.split("\t", 3)
                if len(parts) == 4:
                    rows.append(parts)
    return rows


def sets_of(night):
    """The receipt sets of a night, in report order."""
    out = []
    if os.path.isdir(os.path.join(night, "matrix")):
        out.append("matrix")
        for d in sorted(glob.glob(os.path.join(night, "matrix", "*", ""))):
            out.append("matrix/" + os.path.basename(os.path.dirname(d)))
    for s in ["step", "selftest", "bench"]:
        if os.path.isdir(os.path.join(night, s)):
            out.append(s)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("night")
    ap.add_argument("--backend", default="?")
    ap.add_argument("--matrix", default="all")
    ap.add_argument("--shards", default="?")
    ap.add_argument("--shard", default="")
    ap.add_argument("--previous", default="")
    ap.add_argument("--history", default="", help="file listing the nights of plot/promote, one a line")
    a = ap.parse_args()
    night = os.path.abspath(a.night)
    name = os.path.basename(night)
    steps = read_steps(night)
    failed = [s[0] for s in steps if s[1].startswith("FAILED")]
    out = []
    w = out.append

    w(f"# Night {name}: {'FAILED' if failed else 'passed'}")
    w("")
    if failed:
        w(f"**Failed steps: {', '.join(failed)}** (their logs are under `logs/`).")
        w("")
    version = ""
    vf = os.path.join(night, "version.txt")
    if os.path.exists(vf):
        with open(vf) as fh:
            version = (fh.read().strip().splitlines() or [""])[0]
    matrix = f"shard {a.shard} of --matrix {a.matrix}" if a.shard else f"--matrix {a.matrix} in {a.shards} shard(s)"
    w(f"- backend **{a.backend}**, {matrix}; binary: `{version or 'unknown'}`")
    w(f"- previous night: {('`' + os.path.basename(a.previous) + '`') if a.previous else 'none (first night: no diff)'}")
    window = []
    if a.history and os.path.exists(a.history):
        with open(a.history) as fh:
            window = [ln for ln in fh.read().splitlines() if ln]
    if window:
        w(f"- plot/promote window: {len(window)} night(s): {', '.join('`' + os.path.basename(x) + '`' for x in window)}")
    w("")

    w("## Steps")
    w("")
    w("| step | status | seconds | log |")
    w("|---|---|---:|---|")
    for sname, status, secs, _cmd in steps:
        log = f"`logs/{sname}.log`" if os.path.exists(os.path.join(night, "logs", sname + ".log")) else "-"
        w(f"| {sname} | {'**' + status + '**' if status.startswith('FAILED') else status} | {secs} | {log} |")
    if not steps:
        w("| (none recorded) | | | |")
    w("")

    sets = {s: receipts(os.path.join(night, s)) for s in sets_of(night)}
    w("## Verdicts")
    w("")
    w("| receipts | model | receipts | " + " | ".join(VERDICTS) + " |")
    w("|---|---|---:|" + "---:|" * len(VERDICTS))
    for s, rs in sets.items():
        counts = {v: 0 for v in VERDICTS}
        for _, r in rs:
            v = verdict(r)
            counts[v] = counts.get(v, 0) + 1
        w(f"| `{s}/` | {model(rs)} | {len(rs)} | " + " | ".join(str(counts[v]) for v in VERDICTS) + " |")
    w("")
    w("`selftest/` holds the canaries: each must FAIL at its planted defect (the selftest step's status says whether "
      "every one did); `bench/` holds the performance receipt.")
    w("")
    bad = [(s, f, r) for s, rs in sets.items() if s not in ("selftest",) for f, r in rs
           if verdict(r) in ("FAIL", "ERROR", "VOID") or "unreadable" in r]
    if bad:
        w(f"Not passing ({len(bad)}):")
        w("")
        for s, f, r in bad[:60]:
            reason = (r.get("evidence", {}).get("reason") or r.get("unreadable") or "").replace("\n", " ")
            w(f"- `{s}/{os.path.basename(f)}` {label(r)}: **{verdict(r)}** {reason[:240]}")
        if len(bad) > 60:
            w(f"- … and {len(bad) - 60} more")
        w("")

    w("## Regressions (diff against the previous night)")
    w("")
    diffs = sorted(glob.glob(os.path.join(night, "diff", "*.md")))
    if not diffs:
        w("No diff: " + ("no earlier night." if not a.previous else "no receipt set in common with it."))
    status = {s[0]: s[1] for s in steps}
    for d in diffs:
        base = os.path.splitext(os.path.basename(d))[0]
        st = status.get("diff-" + base, "?")
        with open(d) as fh:
            text = fh.read()
        flagged = [ln for ln in text.splitlines() if "REGRESS" in ln.upper() or "flip" in ln.lower()]
        verdict_word = "no regression" if st == "ok" else f"**{st}**: regression or error"
        # Said as diff says it: a new build whose every digest moved was not compared run for run.
        if st == "ok" and "sources changed, every digest moved" in text:
            verdict_word = "**sources changed, every digest moved** (not a regression check: review the change itself)"
        w(f"### `{base}`: {verdict_word} (`diff/{base}.md`)")
        w("")
        if "host receipts only" in text:
            w("Host receipts only: the oracle and every run use the same host twins, so the twins were not "
              "checked against a device tonight.")
            w("")
        for ln in flagged[:40]:
            w(f"    {ln}")
        if flagged:
            w("")
    w("")

    w("## Promotable doors")
    w("")
    tables = sorted(glob.glob(os.path.join(night, "promote", "*.txt")))
    if not tables:
        w("No promote table was written.")
    for t in tables:
        base = os.path.splitext(os.path.basename(t))[0]
        with open(t) as fh:
            lines = fh.read().splitlines()
        head = next((ln for ln in lines if ln.startswith("promotion over")), "")
        tally = next((ln for ln in lines if "promotable" in ln and "door(s)" in ln), "")
        rows = [ln for ln in lines if "│" in ln and (" promotable " in ln or " exact, no gain " in ln)]
        w(f"### `{base}`: {tally or 'no tally (see the log)'}")
        w("")
        if head:
            w(f"{head}")
            w("")
        for ln in rows:
            cells = [c.strip() for c in ln.strip("│").split("│")]
            # door, env, class, status, evidence, performance (requirement (d): the door pays)
            w(f"- **{cells[0]}** ({cells[1]}) {cells[3]}: {cells[4]}; performance: {cells[5] if len(cells) > 5 else '?'}")
        w(f"\nTable (with a performance column for every door): `promote/{base}.txt`; defaults block: "
          f"`promote/{base}.toml`.")
        w("")

    w("## Door effects and the cost of exactness")
    w("")
    effects = sorted(glob.glob(os.path.join(night, "effects", "*.md")))
    if not effects:
        w("No door effects were written (see the steps).")
    for e in effects:
        base = os.path.splitext(os.path.basename(e))[0]
        w(f"### `{base}`")
        w("")
        chart = os.path.join("plots", base, "door-effects.png")
        if os.path.exists(os.path.join(night, chart)):
            w(f"Door chart over the window's nights: ![door effects]({chart}) (`{chart}`, SVG beside it)")
        else:
            w("Door chart: not drawn (no night of the window has a door configuration beside its parent set).")
        w("")
        with open(e) as fh:
            w(fh.read().rstrip())
        w("")

    w("## Phase times")
    w("")
    w("Summed over each set's receipts (milliseconds in `measurements.extra.phase_*_ms`); model generation and the "
      "host oracle are once per process (the largest of the set's receipts is shown).")
    w("")
    w("| receipts | jobs | Σ wall | " + " | ".join("Σ " + p for p in PHASES) + " | generate | plan oracle |")
    w("|---|---:|---:|" + "---:|" * (len(PHASES) + 2))
    slowest = []
    for s, rs in sets.items():
        wall, tot, gen, plan, jobs = 0.0, {p: 0.0 for p in PHASES}, 0.0, 0.0, 0
        for f, r in rs:
            m = r.get("measurements", {})
            x = m.get("extra", {})
            if "phase_run_ms" not in x:
                continue
            jobs += 1
            wall += m.get("wall_ms", 0.0)
            for p in PHASES:
                tot[p] += x.get(f"phase_{p}_ms", 0.0)
            gen = max(gen, x.get("phase_generate_ms", 0.0))
            plan = max(plan, x.get("phase_plan_oracle_ms", 0.0))
            slowest.append((m.get("wall_ms", 0.0), s, label(r)))
        if jobs:
            w(f"| `{s}/` | {jobs} | {clock(wall)} | " + " | ".join(clock(tot[p]) for p in PHASES)
              + f" | {clock(gen)} | {clock(plan)} |")
    w("")
    if slowest:
        w("Slowest configurations:")
        w("")
        for ms, s, lab in sorted(slowest, reverse=True)[:8]:
            w(f"- {clock(ms)} `{s}/` {lab}")
        w("")

    w("## Paths")
    w("")
    w(f"Night folder: `{night}`")
    w("")
    for sub, what in [("matrix", f"--matrix {a.matrix} receipts (tiny; further models in matrix/<preset>/)"),
                      ("shards", "each shard's run outputs (summary.json, summary.md, junit.xml, latency.csv)"),
                      ("step", "step-shape run"), ("selftest", "canaries"), ("bench", "performance receipt"),
                      ("diff", "diff against the previous night"),
                      ("plots", "plot --history and plot --doors, one folder per set"),
                      ("effects", "door effects and the cost of exactness, one Markdown file per set"),
                      ("promote", "promote tables and defaults blocks"), ("logs", "every step's output")]:
        if os.path.exists(os.path.join(night, sub)):
            w(f"- `{sub}/`: {what}")
    sys.stdout.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
