#!/usr/bin/env bash
# Issue 13, fifth session: inline host ranks and the FP16 E4M3 block path changed only the host
# backend. On the GPU machine: its CPU's vector features (which host path runs there), every GPU
# test module, the default run on CUDA, and the default run on the host of that machine with each
# way of running host ranks (the evidence must be the same bits).
set -uo pipefail
source scripts/gpu/libs.sh
export MEMRA_REQUIRE_GPU=1
G=target-gpu/memra-gates
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) · $(nproc) cores · $(grep -o -w -E 'avx512f|avx512bw|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ')"
bash scripts/gpu/final-check.sh
for mode in threads inline; do
  t0=$(date +%s); timeout 120 $G run --backend host --host-ranks $mode --quiet --out /tmp/host-$mode > /tmp/host-$mode.log 2>&1
  echo "host run --host-ranks $mode exit $? in $(( $(date +%s)-t0 ))s: $(grep -E '→' /tmp/host-$mode.log | tr '\n' ' ')"
done
python3 - <<'PY'
import json, glob, os
def ev(d):
    out = {}
    for f in glob.glob(d + '/**/run-*.json', recursive=True):
        e = json.load(open(f))['evidence']; e.pop('build', None); e.pop('performance', None)
        out[os.path.relpath(f, d)] = e
    return out
a, b = ev('/tmp/host-threads'), ev('/tmp/host-inline')
print(f"host evidence threads vs inline: {len(a)} and {len(b)} receipts, {sum(a[k] != b.get(k) for k in a)} differ")
PY
tar czf $OUT/host-modes.tgz -C /tmp host-threads.log host-inline.log
