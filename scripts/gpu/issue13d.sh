#!/usr/bin/env bash
# Issue 13, evening check of 2026-12-01: every GPU test module and the default run (final-check.sh,
# now with the host side's AVX-512 NVFP4, W8, tree and FP16-decode paths), then the `edge` model's
# `--matrix all` on CUDA, first the TP2 native-p2p lane where the host run had found VOIDs
# (MOE_DIRECT and STEP_EP not witnessed), then the whole plan in what time is left.
set -uo pipefail
source scripts/gpu/libs.sh
export NCCL_NVLS_ENABLE=0
G=target-gpu/memra-gates
bash scripts/gpu/final-check.sh
t0=$(date +%s)
timeout 120 $G run --matrix all --backend cuda --preset edge --tp 2 --transport native-p2p --out /tmp/edge-tp2 \
  --progress-every 30 > /tmp/edge-tp2.log 2>&1
echo "edge all TP2 native-p2p exit $? in $(( $(date +%s)-t0 ))s: $(grep -E '→' /tmp/edge-tp2.log | tr '\n' ' ')"
t0=$(date +%s)
timeout 240 $G run --matrix all --backend cuda --preset edge --out /tmp/edge-all --progress-every 30 > /tmp/edge-all.log 2>&1
echo "edge all exit $? in $(( $(date +%s)-t0 ))s: $(grep -E '→' /tmp/edge-all.log | tr '\n' ' ')"
grep -E "progress" /tmp/edge-all.log | tail -1 | cut -c1-160
for d in edge-tp2 edge-all; do [ -f /tmp/$d/summary.json ] && cp /tmp/$d/summary.json $OUT/$d-summary.json; done
tar czf $OUT/edge.tgz -C /tmp edge-tp2.log edge-all.log
