#!/usr/bin/env bash
# Issue 13's targets on one GPU call (one H200, ≤ 600 s; this script stays under BUDGET, default
# 525 s, plus a few seconds of estimates and packing): the wall time of
#   1. the step shape: run --backend cuda --preset step --layers 4 --prompts 2 --gen-tokens 8
#      --tp 1,2,4,8 --transport host-bounce,native-p2p                       (target ≤ 3 min)
#   2. run --matrix single --backend cuda --preset step --layers 2          (target ≤ 15 min)
#   3. run --matrix all --backend cuda --preset tiny                         (target ≤ 60 min)
# Steps 2 and 3 may not fit one call whole: each runs a shard (SINGLE_SHARD, default 0/6, and
# ALL_SHARD, default 0/8; a shard holds a contiguous block of every TP size and transport, see
# `matrix::shard`) under its own time limit (SINGLE_SECS, default 140; ALL_SECS, default 130), and
# `matrix --explain --history` estimates the whole plan from the shard's receipts (their phase
# times: each configuration's own time, one upload per weight layout, the model and references
# once). The estimate is stated as such in the summary, never as a measurement. STEPS (default
# "step single all") chooses the steps; STEP_SECS (default 250) limits the first.
#
# Build elsewhere (no toolchain here) and carry the binary, stripped:
#   cargo build --release && mkdir -p target/gpu && cp target/release/memra-gates target/gpu/ && strip target/gpu/memra-gates
# Usage (repository root, on the GPU machine): scripts/gpu/issue13.sh [DIR]  (DIR holds memra-gates,
# default target/gpu). Everything (receipts, logs, summary.md) is packed into $OUT/issue13.tgz;
# summary.md is also copied to $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
dir="${1:-target/gpu}"
gates="$dir/memra-gates"
[ -x "$gates" ] || { echo "no memra-gates executable at $gates"; exit 2; }
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"
# shellcheck source=scripts/gpu/libs.sh
source scripts/gpu/libs.sh
export MEMRA_REQUIRE_GPU=1 RUST_BACKTRACE=1
out=$(mktemp -d)
summary="$out/summary.md"
rc=0
# The sections share BUDGET seconds (scripts/gpu/sections.sh: a step with under 30 s left is
# skipped, and says so); the default leaves the last ~15 s of 540 for the estimates and packing.
BUDGET="${BUDGET:-525}"
# shellcheck source=scripts/gpu/sections.sh
source scripts/gpu/sections.sh
timed() { # NAME FOLDER WANTED-SECONDS ARGS…: run memra-gates ARGS (--out $out/FOLDER) under a limit
    local name="$1" folder="$2" secs t0 t1 code
    secs=$(limit "$3")
    shift 3
    if [ "$secs" -eq 0 ]; then
        echo "| $name | \`memra-gates $*\` | skipped: budget spent | | |" >>"$summary"
        rc=1
        return
    fi
    echo "== $name (≤ ${secs}s): memra-gates $*"
    t0=$(date +%s.%N)
    if [ -x /usr/bin/time ]; then
        timeout "$secs" /usr/bin/time -v "$gates" "$@" >"$out/$name.log" 2>&1
    else
        timeout "$secs" "$gates" "$@" >"$out/$name.log" 2>&1
    fi
    code=$?
    t1=$(date +%s.%N)
    local wall counts
    wall=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
    counts=$(grep -E '^[0-9]+ (PASS|FAIL|VOID|ERROR|NOT-APPLICABLE|SKIP)' "$out/$name.log" | tail -1)
    [ "$code" -eq 0 ] || rc=1
    [ "$code" -eq 124 ] && counts="TIMED OUT after ${secs}s (receipts so far: $(ls "$out/$folder"/run-*.json 2>/dev/null | wc -l)) ${counts}"
    echo "| $name | \`memra-gates $*\` | ${wall} s | $code | ${counts:-see $name.log} |" >>"$summary"
    grep -E 'Maximum resident|Elapsed \(wall' "$out/$name.log" | sed 's/^\s*/    /'
    tail -3 "$out/$name.log"
}
estimate() { # NAME HISTORY-DIR MATRIX-ARGS…: the whole plan's estimate from a shard's receipts
    local name="$1" hist="$2"
    shift 2
    if ! compgen -G "$hist/run-*.json" >/dev/null; then
        echo "- $name: no receipts in $(basename "$hist"): no estimate" >>"$out/estimates.md"
        return
    fi
    "$gates" matrix "$@" --backend cuda --explain --history "$hist" >"$out/$name-estimate.log" 2>&1 || rc=1
    {
        echo "- $name (\`memra-gates matrix $* --backend cuda --explain --history $(basename "$hist")\`):"
        grep -E '^(estimate|estimated duration|[0-9]+ legal, [0-9]+ not applicable|[0-9]+ cuda configuration)' "$out/$name-estimate.log" | sed 's/^/    /'
    } >>"$out/estimates.md"
}

nvidia-smi -L 2>/dev/null | tee "$out/gpus.txt"
"$gates" --version | tee "$out/version.txt"
{
    echo "# issue 13 on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || echo '?') × $(nvidia-smi -L 2>/dev/null | wc -l), $(date -u +%FT%TZ)"
    echo
    echo "| step | command | wall | exit | verdicts |"
    echo "|---|---|---:|---:|---|"
} >"$summary"
: >"$out/estimates.md"

steps="${STEPS:-step single all}"
if [[ " $steps " == *" step "* ]]; then
    timed step step "${STEP_SECS:-250}" run --backend cuda --preset step --layers 4 --prompts 2 --gen-tokens 8 \
        --tp 1,2,4,8 --transport host-bounce,native-p2p --progress-every 20 --out "$out/step"
fi
if [[ " $steps " == *" single "* ]]; then
    single="${SINGLE_SHARD:-0/6}"
    timed "single-shard-${single/\//of}" single "${SINGLE_SECS:-140}" run --matrix single --backend cuda --preset step \
        --layers 2 --shard "$single" --progress-every 20 --out "$out/single"
    estimate single "$out/single" --matrix single
fi
if [[ " $steps " == *" all "* ]]; then
    all="${ALL_SHARD:-0/8}"
    # ALL_ARGS narrows the plan further (e.g. "--tp 1,2,4,8 --transport host-bounce": whole lanes).
    # shellcheck disable=SC2086
    timed "all-tiny-shard-${all/\//of}" all "${ALL_SECS:-130}" run --matrix all --backend cuda --preset tiny \
        --shard "$all" ${ALL_ARGS:-} --progress-every 20 --out "$out/all"
    estimate all-tiny "$out/all" --matrix all
fi

{
    echo
    echo "Estimates of the whole plans from the shards' receipts (not measurements):"
    echo
    cat "$out/estimates.md"
    echo
    echo "Phase times of every receipt (ms, summed per run): see each folder's receipts, measurements.extra.phase_*_ms."
} >>"$summary"
if command -v python3 >/dev/null; then
    python3 - "$out" >>"$summary" <<'EOF' || true
import glob, json, os, sys
out = sys.argv[1]
print("\n| receipts | jobs | Σ wall s | Σ upload | Σ oracle | Σ run | Σ probe | Σ gates | generate | plan oracle | median job s |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for d in ["step", "single", "all"]:
    walls, tot, gen, plan = [], {}, 0.0, 0.0
    for f in glob.glob(os.path.join(out, d, "run-*.json")):
        r = json.load(open(f))
        x, m = r["measurements"].get("extra", {}), r["measurements"]
        if "phase_run_ms" not in x:
            continue
        walls.append(m["wall_ms"] / 1e3)
        for p in ["upload", "oracle", "run", "probe", "gates"]:
            tot[p] = tot.get(p, 0.0) + x.get(f"phase_{p}_ms", 0.0) / 1e3
        gen, plan = max(gen, x.get("phase_generate_ms", 0) / 1e3), max(plan, x.get("phase_plan_oracle_ms", 0) / 1e3)
    if walls:
        walls.sort()
        cells = " | ".join(f"{tot.get(p, 0):.1f}" for p in ["upload", "oracle", "run", "probe", "gates"])
        print(f"| {d} | {len(walls)} | {sum(walls):.1f} | {cells} | {gen:.1f} | {plan:.1f} | {walls[len(walls) // 2]:.2f} |")
print("\nPer lane (median ms per job): | receipts | TP | transport | jobs | run | oracle | wall |")
for d in ["step", "single", "all"]:
    lanes = {}
    for f in glob.glob(os.path.join(out, d, "run-*.json")):
        r = json.load(open(f))
        x, m, c = r["measurements"].get("extra", {}), r["measurements"], r["evidence"]["config"]
        lanes.setdefault((c.get("tp"), c.get("transport")), []).append((x.get("phase_run_ms", 0), x.get("phase_oracle_ms", 0), m["wall_ms"]))
    for (tp, tr), v in sorted(lanes.items(), key=lambda kv: str(kv[0])):
        med = lambda i: sorted(t[i] for t in v)[len(v) // 2]
        print(f"| {d} | {tp} | {tr} | {len(v)} | {med(0):.0f} | {med(1):.0f} | {med(2):.0f} |")
EOF
fi
echo "total: $(( $(date +%s) - start ))s" | tee -a "$summary"
cat "$summary"
if [ -n "${OUT:-}" ]; then
    tar czf "$OUT/issue13.tgz" -C "$out" . && echo "receipts and logs: \$OUT/issue13.tgz"
    cp "$summary" "$OUT/issue13-summary.md"
else
    echo "everything in $out"
fi
exit "$rc"
