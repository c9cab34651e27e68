#!/usr/bin/env bash
# A whole `run --matrix all --backend cuda` on one GPU as PROCS concurrent shard processes (issue
# 13): shard I of PROCS in its own process, all on the same GPU, as `scripts/nightly.sh --shards
# PROCS` runs them on a one-GPU runner. Prints per-shard and overall figures; writes under $OUT:
# receipts.csv (one line per receipt: shard, TP, transport, doors, verdict, wall ms), shards.txt,
# gpu.csv (nvidia-smi utilisation samples every 5 s).
# Measured on one H200 with PROCS=8 (docs/gpu/2026-12-01-issue13c/): about 0.45x the throughput of
# one process, the GPU time-sliced between contexts. Kept to repeat that measurement on other GPUs.
#   PROCS (8) · SECS (540: each shard's time limit) · ARGS ("--preset tiny") · BIN (target/gpu/memra-gates)
set -uo pipefail
source scripts/gpu/libs.sh
PROCS="${PROCS:-8}"; SECS="${SECS:-540}"; ARGS="${ARGS:---preset tiny}"; BIN="${BIN:-target/gpu/memra-gates}"
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"; W=/tmp/procs; rm -rf "$W"; mkdir -p "$W"
read -r -a extra <<<"$ARGS"
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 5 >"$OUT/gpu.csv" 2>/dev/null &
smi=$!
t0=$(date +%s.%N)
pids=()
for ((i = 0; i < PROCS; i++)); do
    ( s=$(date +%s.%N)
      timeout "$SECS" "$BIN" run --matrix all --backend cuda --shard "$i/$PROCS" --out "$W/$i" --quiet "${extra[@]}" \
          >"$W/$i.log" 2>&1
      rc=$?
      echo "shard $i/$PROCS exit $rc in $(awk "BEGIN{print $(date +%s.%N) - $s}") s" >"$W/$i.done" ) &
    pids+=("$!")
done
for p in "${pids[@]}"; do wait "$p"; done
wall=$(awk "BEGIN{print $(date +%s.%N) - $t0}")
kill "$smi" 2>/dev/null
cat "$W"/*.done | sort -V | tee "$OUT/shards.txt"
for ((i = 0; i < PROCS; i++)); do grep -hE "PASS|FAIL" "$W/$i.log" | tail -1 | sed "s/^/shard $i: /"; done | tee -a "$OUT/shards.txt"
python3 - "$W" "$PROCS" "$OUT/receipts.csv" <<'PY'
import json, glob, sys, collections, statistics
w, procs, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rows = []
for i in range(procs):
    for f in glob.glob(f"{w}/{i}/run-*.json"):
        r = json.load(open(f))
        e = r["evidence"]; c = e.get("config", {})
        rows.append((i, c.get("tp"), c.get("transport"), "+".join(sorted(k for k, v in c.get("doors", {}).items() if v)) or "defaults",
                     e["verdict"], round(r["measurements"]["wall_ms"])))
with open(out, "w") as fh:
    fh.write("shard,tp,transport,doors,verdict,wall_ms\n")
    for r in rows: fh.write(",".join(map(str, r)) + "\n")
v = collections.Counter(r[4] for r in rows)
print(f"receipts {len(rows)}: " + ", ".join(f"{k} {n}" for k, n in sorted(v.items())))
by = collections.defaultdict(list)
for r in rows: by[(r[1], r[2])].append(r[5])
for k in sorted(by, key=str): print(f"TP{k[0]} {k[1]}: {len(by[k])} receipts, median wall {statistics.median(by[k]):.0f} ms")
PY
echo "PROCS=$PROCS whole wall $wall s"
