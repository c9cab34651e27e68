#!/usr/bin/env bash
# `run --worker-processes N` under MPS against one process, same plan, same call:
#   [N="8"] [PLAN="--matrix all --tp 1 --transport host-bounce"] [NEED=120] [ONE=0] \
#     bash scripts/gpu/night_workers.sh S BIN [OTHER_BIN...]
# starts an MPS daemon of this call's own (pipe and log folders under /tmp, stopped at the end
# however the script ends), runs `B run --backend cuda PLAN --worker-processes n` for each
# binary B (BIN, then each OTHER_BIN: builds whose parts differ, interleaved as given) and each
# count n of N, stops the daemon, runs the same plan in one process with BIN, then compares each
# workers run's receipts with it (every file name and every receipt's evidence equal), prints each
# build's `matrix --explain --worker-processes n` line, and the per-run rates `matrix --explain
# --history` reads from the single process's receipts. NEED: seconds each workers step needs.
# ONE=0: no single-process run (a plan too long for it); each workers run is compared with the
# first one instead.
# (`mps_start` in libs.sh: MPS changes no setting of the GPU.)
set -uo pipefail
source scripts/gpu/libs.sh
usage="usage: [N=\"8\"] [PLAN=...] [NEED=120] night_workers.sh S BIN [OTHER_BIN...]"
s=${1:?$usage}; bin=${2:?$usage}; bins=("${@:2}")
counts=(${N:-8}); plan=(${PLAN:---matrix all --tp 1 --transport host-bounce}); need=${NEED:-120}
call_start night-workers "$s"
runs=()
mps_start || exit 0
for n in "${counts[@]}"; do
  for k in "${!bins[@]}"; do
    name=w$k-$n
    step "$name" "$need" "${bins[$k]}" run --backend cuda "${plan[@]}" --worker-processes "$n" --replace --out "/tmp/$name"
    grep -E "PASS|FAIL|error|incomplete" "/tmp/$name.log" | grep -v "│" | grep -v " ended " | tail -2 | sed "s|^|  $name: |"
    echo "  $name ends (part:seconds/PASS): $(grep -E " ended " "/tmp/$name.log" |
      sed -E 's|.*worker ([0-9]+)/[0-9]+ ended.* at ([0-9]+) s: ([0-9]+) PASS.*|\1:\2/\3|' | sort -n | tr '\n' ' ')"
    runs+=("$name")
  done
done
mps_stop
ref=/tmp/n1
if [ "${ONE:-1}" = 0 ]; then
  ref=/tmp/${runs[0]}
else
  step one "$need" "$bin" run --backend cuda "${plan[@]}" --quiet --replace --out /tmp/n1
  grep -E "PASS|FAIL|error" /tmp/one.log | grep -v "│" | tail -3
fi
python3 - "$ref" "${runs[@]}" <<'PY'
import json, os, sys
names = lambda d: sorted(f for f in os.listdir(d) if f.startswith("run-") and f.endswith(".json")) if os.path.isdir(d) else []
for run in sys.argv[2:]:
    if os.path.join("/tmp", run) == sys.argv[1]:
        continue  # the reference itself (ONE=0): nothing to compare
    for sub in ("", "edge"):
        a, b = os.path.join(sys.argv[1], sub), os.path.join("/tmp", run, sub)
        if not os.path.isdir(a):
            continue
        na, nb = names(a), names(b)
        same = sum(json.load(open(os.path.join(a, f)))["evidence"] == json.load(open(os.path.join(b, f)))["evidence"]
                   for f in na if f in nb)
        print(f"{run} {sub or '.'}: {os.path.basename(sys.argv[1])} {len(na)} receipts, workers {len(nb)}, evidence equal in {same}")
PY
for n in "${counts[@]}"; do
  for k in "${!bins[@]}"; do
    "${bins[$k]}" matrix --backend cuda "${plan[@]}" --explain --worker-processes "$n" 2>/dev/null |
      grep -E "^with" | cut -c1-120 | sed "s|^|  w$k: |"
  done
done
for d in /tmp/n1 /tmp/n1/edge; do
  [ -d "$d" ] && "$bin" matrix --matrix all --backend cuda --explain --history "$d" 2>/dev/null | grep -E "^estimated" | sed "s|^|$d: |"
done
tar czf "$OUT/night-workers.tgz" -C /tmp one.log $(printf '%s.log ' "${runs[@]}") 2>/dev/null
python3 scripts/gpu/lane_costs.py "$ref" > "$OUT/lane-costs.txt" 2>/dev/null
echo "done in $(( $(date +%s)-STEPS_START ))s"
