#!/usr/bin/env bash
# `run --worker-processes N` under MPS against one process, same plan, same call:
#   [N=8] [PLAN="--matrix all --tp 1 --transport host-bounce"] bash scripts/gpu/night_workers.sh S BIN
# starts an MPS daemon of this call's own (pipe and log folders under /tmp, stopped at the end
# however the script ends), runs `BIN run --backend cuda PLAN --worker-processes N`, stops the
# daemon, runs the same plan in one process, then compares the two runs' receipts (every file
# name and every receipt's evidence equal) and prints the per-run rates `matrix --explain
# --history` reads from the single process's receipts. (`mps_start` in libs.sh: MPS changes no
# setting of the GPU.)
set -uo pipefail
source scripts/gpu/libs.sh
usage="usage: [N=8] [PLAN=...] night_workers.sh S BIN"
s=${1:?$usage}; bin=${2:?$usage}
n=${N:-8}; plan=(${PLAN:---matrix all --tp 1 --transport host-bounce})
call_start night-workers "$s"
mps_start || exit 0
step workers 120 "$bin" run --backend cuda "${plan[@]}" --worker-processes "$n" --replace --out /tmp/nw
grep -E "worker|PASS|FAIL|error" /tmp/workers.log | grep -v "│" | tail -$((n + 4))
mps_stop
step one 150 "$bin" run --backend cuda "${plan[@]}" --quiet --replace --out /tmp/n1
grep -E "PASS|FAIL|error" /tmp/one.log | grep -v "│" | tail -3
python3 - <<'EOF'
import json, os
for sub in ("", "edge"):
    a, b = os.path.join("/tmp/n1", sub), os.path.join("/tmp/nw", sub)
    if not os.path.isdir(a):
        continue
    names = lambda d: sorted(f for f in os.listdir(d) if f.startswith("run-") and f.endswith(".json"))
    na, nb = names(a), names(b) if os.path.isdir(b) else []
    same = sum(json.load(open(os.path.join(a, f)))["evidence"] == json.load(open(os.path.join(b, f)))["evidence"]
               for f in na if f in nb)
    print(f"folder {sub or '.'}: one process {len(na)} receipts, workers {len(nb)}, evidence equal in {same}")
EOF
for d in /tmp/n1 /tmp/n1/edge; do
  [ -d "$d" ] && "$bin" matrix --matrix all --backend cuda --explain --history "$d" 2>/dev/null | grep -E "^estimated" | sed "s|^|$d: |"
done
tar czf "$OUT/night-workers.tgz" -C /tmp workers.log one.log nw n1 2>/dev/null
echo "done in $(( $(date +%s)-STEPS_START ))s"
