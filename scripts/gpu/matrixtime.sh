#!/usr/bin/env bash
# How long `run --matrix all` (tiny and edge, every axis) takes on this machine's GPU(s) with P
# concurrent processes, measured on a sample: P processes run shards FIRST..FIRST+P-1 of N at once
# (each shard is a proportional block of every backend × TP × transport lane, so a shard is a
# representative sample of the plan), and the whole plan is estimated as wall × N / P.
# Usage: matrixtime.sh P N FIRST [BIN]. Output: one line per run and the estimate; receipts under
# /tmp/matrixtime/P<P>/<i>.
set -uo pipefail
P=$1 N=$2 FIRST=$3 BIN=${4:-target-gpu/memra-gates}
gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
dir=/tmp/matrixtime/P$P; rm -rf "$dir"; mkdir -p "$dir"
t0=$(date +%s%N); pids=()
for ((k = 0; k < P; k++)); do
  i=$(( FIRST + k ))
  CUDA_VISIBLE_DEVICES=$(( k % gpus )) "$BIN" run --matrix all --backend cuda --shard "$i/$N" --quiet \
    --out "$dir/$i" > "$dir/$i.log" 2>&1 &
  pids+=("$!")
done
rc=0; for p in "${pids[@]}"; do wait "$p" || rc=1; done
wall=$(awk -v a="$t0" -v b="$(date +%s%N)" 'BEGIN {printf "%.1f", (b - a) / 1e9}')
n=$(ls "$dir"/*/run-*.json "$dir"/*/edge/run-*.json 2>/dev/null | wc -l)
verdicts=$(cat "$dir"/*.log | grep -hoE "[0-9]+ (PASS|FAIL|VOID|ERROR|NOT-APPLICABLE)" | awk '{s[$2]+=$1} END {for (k in s) printf "%s %d  ", k, s[k]}')
printf 'P=%d shards %d..%d of %d on %d GPU(s): %d receipts in %.1f s (%s) exit %d\n' "$P" "$FIRST" $(( FIRST + P - 1 )) "$N" "$gpus" "$n" "$wall" "$verdicts" "$rc"
awk -v w="$wall" -v n="$N" -v p="$P" 'BEGIN {printf "  estimate of the whole plan (tiny + edge) with %d processes: %.1f min\n", p, w * n / p / 60}'
