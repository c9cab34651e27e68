#!/usr/bin/env bash
# The evening session's last GPU call (2026-12-03): every module of the GPU test binary on the
# merged build (block-per-lane E4M3, batched single-row loads, SEL_MIRROR / FENCE_RANK1 and their
# cuda_doors29 module, the census type boundary), selftest on CUDA, the two doors in `run` on
# co-resident TP2/4/8 with `matrix --explain`'s exclusions, and the PyTorch subject's columns.
set -uo pipefail
source scripts/gpu/libs.sh
gpu_call final-e
steps_start "${FINAL_DEADLINE:-500}"
step gpu_tests 210 $T --test-threads=1 --skip cuda_kernels::
grep -E "^test result" /tmp/gpu_tests.log; grep -E "^test .*FAILED" /tmp/gpu_tests.log | head; grep -E "panicked" -A5 /tmp/gpu_tests.log | head -20
grep -E "^test cuda_doors29" /tmp/gpu_tests.log | head -10
step selftest 45 $G selftest --backend cuda --out /tmp/selftest
tail -3 /tmp/selftest.log
step selmirror 60 $G run --backend cuda --door MEMRA_SEL_MIRROR --tp 2,4,8 --transport native-p2p --quiet --out /tmp/selmirror
tail -3 /tmp/selmirror.log
step fencerank1 60 $G run --backend cuda --door MEMRA_MOE_DIRECT --door MEMRA_FENCE_MEMOPS --door MEMRA_FENCE_RANK1 --tp 2,4,8 --transport native-p2p --quiet --out /tmp/fencerank1
tail -3 /tmp/fencerank1.log
step explain 20 $G matrix --matrix single --backend cuda --explain
grep -E "sel_mirror|fence_rank1" /tmp/explain.log | head -12
step torchcols 100 $G run --subject scripts/subjects/torch.toml --backend cuda --tp 1 --transport host-bounce --prompts 8 --columns 1,2,4,8 --out /tmp/torchcols
grep -E "│ cuda|PASS|FAIL|ERROR|NOT-APPLICABLE" /tmp/torchcols.log | tail -8
tar czf $OUT/final-e.tgz -C /tmp $(cd /tmp && ls -d *.log selftest selmirror fencerank1 torchcols 2>/dev/null) 2>/dev/null
echo "done in $(( $(date +%s)-STEPS_START ))s"
