#!/usr/bin/env bash
# Issue 29's STEP_EP_DEVICE_ARITHMETIC on one H200 (co-resident TP2/4/8), for the lead's GPU call:
# the twin test of the grouped expert kernels (expert_gate_up_rows_f32 beside the fused kernel),
# the GPU test module cuda_ep_device29 (edge: device = host oracle and device census = host census
# with STEP_EP's arithmetic on the host and on the device, and under GRAPH), then `run` of the door
# (with STEP_EP, which it requires) and of STEP_EP alone, on tiny (edge at TP4/8 is NOT-APPLICABLE:
# its experts are expert-parallel already), with `matrix --explain` for the exclusions.
set -uo pipefail
source scripts/gpu/libs.sh
gpu_call ep_device29
steps_start "${FINAL_DEADLINE:-540}"
step gpu_twins 120 $T --test-threads=1 grouped_expert_kernels_match_twins
grep -E "^test |^test result" /tmp/gpu_twins.log | tail -4; grep -E "panicked" -A5 /tmp/gpu_twins.log | head -20
step gpu_ep 180 $T --test-threads=1 cuda_ep_device29
grep -E "^test |^test result|^ok " /tmp/gpu_ep.log | tail -14; grep -E "panicked" -A5 /tmp/gpu_ep.log | head -20
step epdev 90 $G run --backend cuda --door MEMRA_STEP_EP --door MEMRA_STEP_EP_DEVICE_ARITHMETIC --tp 2,4,8 --transport native-p2p --quiet --out /tmp/epdev
tail -3 /tmp/epdev.log
step stepep 90 $G run --backend cuda --door MEMRA_STEP_EP --tp 2,4,8 --transport native-p2p --quiet --out /tmp/stepep
tail -3 /tmp/stepep.log
step explain 20 $G matrix --matrix single --backend cuda --explain
grep -E "ep_device_arithmetic" /tmp/explain.log | head -12
tar czf $OUT/ep_device29.tgz -C /tmp $(cd /tmp && ls -d *.log epdev stepep 2>/dev/null) 2>/dev/null
echo "done in $(( $(date +%s)-STEPS_START ))s"
