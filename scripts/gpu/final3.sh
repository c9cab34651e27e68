#!/usr/bin/env bash
# The session's last GPU call (2026-12-03 afternoon 2): every module of the GPU test binary on the
# merged build (lane-grid launches, the length mirrors of LEN_MIRROR_LAZY, protocol v2), the
# PyTorch subject's batched rows through protocol 2 (fp32 and the bf16 door), LEN_MIRROR_LAZY on
# CUDA (alone and under GRAPH), bench of the step layer at b1 and b8, selftest on CUDA.
set -uo pipefail
source scripts/gpu/libs.sh
gpu_call final3
steps_start "${FINAL_DEADLINE:-540}"
step gpu_tests 200 env MEMRA_GPU_STEP=1 $T --test-threads=1
grep -E "^test result" /tmp/gpu_tests.log; grep -E "^test .*(FAILED|ignored)" /tmp/gpu_tests.log | head; grep -E "panicked" -A5 /tmp/gpu_tests.log | head -20
step torch 120 $G run --subject scripts/subjects/torch.toml --backend cuda --tp 1 --transport host-bounce --prompts 8 --batch 1,2,4,8 --out /tmp/torch
grep -E "│ cuda|PASS|FAIL|ERROR" /tmp/torch.log | tail -8
step torchbf16 90 $G run --subject scripts/subjects/torch.toml --backend cuda --tp 1 --transport host-bounce --prompts 8 --batch 1,2,4,8 --door MEMRA_TORCH_BF16_MATMUL --out /tmp/torchbf16
grep -E "│ cuda|PASS|FAIL|ERROR" /tmp/torchbf16.log | tail -8
for shape in "--batch 1" "--batch 8"; do
  n=bench$(echo $shape | tr -d ' -'); step $n 35 $G bench --backend cuda --preset step --layers 2 --graph $shape --out /tmp/$n
  grep -E "^[01] |L0: .*per token|pass floor|distinct" /tmp/$n.log | head -8
done
step lenmirror 40 $G run --backend cuda --door MEMRA_LEN_MIRROR_LAZY --tp 1,2,4 --quiet --out /tmp/lenmirror
tail -2 /tmp/lenmirror.log
step lenmirrorgraph 40 $G run --backend cuda --door MEMRA_LEN_MIRROR_LAZY --door MEMRA_STEP_TP_GRAPH --tp 1,2 --quiet --out /tmp/lenmirrorgraph
tail -2 /tmp/lenmirrorgraph.log
step selftest 45 $G selftest --backend cuda --out /tmp/selftest
tail -2 /tmp/selftest.log
tar czf $OUT/final3.tgz -C /tmp $(cd /tmp && ls -d *.log torch torchbf16 bench* lenmirror* selftest 2>/dev/null) 2>/dev/null
echo "done in $(( $(date +%s)-STEPS_START ))s"
