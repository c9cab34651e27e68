#!/usr/bin/env bash
# Issue 29's SEL_MIRROR and FENCE_RANK1 on one H200 (co-resident TP2/4/8), for the lead's GPU
# call: the GPU test module cuda_doors29 (mirror kernel bit for bit, device = host oracle on edge,
# one kernel doorbell per MOE_DIRECT store, the skip-fence canary caught with FENCE_RANK1 on),
# then `run` of each door (its requirements added) and of the pairs that must be refused, with
# `matrix --explain` for the exclusions.
set -uo pipefail
source scripts/gpu/libs.sh
gpu_call doors29
steps_start "${FINAL_DEADLINE:-540}"
step gpu_doors29 150 $T --test-threads=1 cuda_doors29
grep -E "^test |^test result" /tmp/gpu_doors29.log | tail -14; grep -E "panicked" -A5 /tmp/gpu_doors29.log | head -20
step selmirror 60 $G run --backend cuda --door MEMRA_SEL_MIRROR --tp 2,4,8 --transport native-p2p --quiet --out /tmp/selmirror
tail -3 /tmp/selmirror.log
step fencerank1 60 $G run --backend cuda --door MEMRA_MOE_DIRECT --door MEMRA_FENCE_MEMOPS --door MEMRA_FENCE_RANK1 --tp 2,4,8 --transport native-p2p --quiet --out /tmp/fencerank1
tail -3 /tmp/fencerank1.log
step explain 20 $G matrix --matrix single --backend cuda --explain
grep -E "sel_mirror|fence_rank1" /tmp/explain.log | head -20
tar czf $OUT/doors29.tgz -C /tmp $(cd /tmp && ls -d *.log selmirror fencerank1 2>/dev/null) 2>/dev/null
echo "done in $(( $(date +%s)-STEPS_START ))s"
