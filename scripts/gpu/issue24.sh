#!/usr/bin/env bash
# Issue 24 (rows and columns) on one H200, one call: the GPU test modules of rows and columns
# (cuda_passes with the step preset, cuda_lanes), selftest on CUDA (the rows and columns canaries
# included), bench at batch 8, batch 1 and columns 8 (PyTorch anchor at the same batch), a
# `--matrix single` night with the default pass shapes on tiny and edge, then the census-parity and
# graph modules. Each step runs only while the call's deadline leaves room for it. Summary lines to
# stdout and $OUT/issue24.txt, logs and receipts in $OUT/issue24.tgz.
set -uo pipefail
source scripts/gpu/libs.sh
gpu_call issue24
steps_start "${ISSUE24_DEADLINE:-400}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
step cuda_passes 120 env MEMRA_GPU_STEP=1 $T --test-threads=1 cuda_passes::
grep -E "^test |^ok step|test result" /tmp/cuda_passes.log | tail -8; grep -E "panicked|FAILED" -A3 /tmp/cuda_passes.log | head -8
step cuda_lanes 20 $T --test-threads=1 cuda_lanes::
grep "test result" /tmp/cuda_lanes.log
step selftest 60 $G selftest --backend cuda --out /tmp/selftest
grep -E "batch_ksplit|neighbour|verify_part|selftest:" /tmp/selftest.log | head -12
for shape in "--batch 8" "--batch 1" "--columns 8"; do
  n=bench$(echo $shape | tr -d ' -'); step $n 45 $G bench --backend cuda --preset step --layers 2 --graph $shape --out /tmp/$n
  grep -E "per token|L[01]: .*per token|fastest|PyTorch whole|gate overhead|^[01] " /tmp/$n.log | head -8
done
step night 90 $G run --matrix single --backend cuda --tp 1,2 --transport native-p2p --quiet --out /tmp/night
grep -E "PASS|FAIL|VOID" /tmp/night.log | grep -E "→|memra-gates" | head -6
step cuda_gates 20 $T --test-threads=1 cuda_gates::census
step cuda_graph 15 $T --test-threads=1 cuda_graph::
grep -h "test result" /tmp/cuda_gates.log /tmp/cuda_graph.log 2>/dev/null
tar czf $OUT/issue24.tgz -C /tmp $(cd /tmp && ls -d *.log selftest night bench* 2>/dev/null) 2>/dev/null
echo "done in $(( $(date +%s)-STEPS_START ))s"
