#!/usr/bin/env bash
# Does the night scale over processes on one GPU when CUDA's multi-process service (MPS) merges
# their work into one context? (A night is host-bound: each run is driver calls, docs/gpu.)
#   [N=8] [TOTAL=800] [FIRST=7] bash scripts/gpu/mps_night.sh S BIN
# runs shards FIRST..FIRST+N-1 of TOTAL of `run --matrix all --backend cuda --preset tiny` with BIN
# one after another, then all N at once under an MPS daemon of this call's own (its pipe and log
# folders under /tmp, stopped at the end however the script ends), then all N at once without MPS
# while time is left. Every shard's last line (its verdict counts) is printed beside the times.
# (`mps_start` in libs.sh: MPS changes no setting of the GPU.)
set -uo pipefail
source scripts/gpu/libs.sh
usage="usage: [N=8] [TOTAL=800] [FIRST=7] mps_night.sh S BIN"
s=${1:?$usage}; bin=${2:?$usage}
n=${N:-8}; total=${TOTAL:-800}; first=${FIRST:-7}
call_start mps-night "$s"
shard() { "$bin" run --matrix all --backend cuda --preset tiny --shard "$1/$total" --quiet --replace --out "/tmp/$2-$1" > "/tmp/$2-$1.log" 2>&1; }
verdicts() { local i; for ((i = first; i < first + n; i++)); do echo "  $1 $i/$total: $(tail -1 "/tmp/$1-$i.log")"; done; }
t0=$(date +%s)
for ((i = first; i < first + n; i++)); do shard "$i" seq; done
echo "one after another: $n shards in $(( $(date +%s)-t0 ))s"; verdicts seq
together() {
  local tag=$1 t0=$(date +%s) pids=() i
  for ((i = first; i < first + n; i++)); do shard "$i" "$tag" & pids+=($!); done
  wait "${pids[@]}"
  echo "$tag: $n shards at once in $(( $(date +%s)-t0 ))s"; verdicts "$tag"
}
mps_start && { together mps; mps_stop; }
[ "$(left)" -gt 150 ] && together plain
echo "done in $(( $(date +%s)-STEPS_START ))s"
