#!/usr/bin/env bash
# Issue 29's SEL_DOWN8 on one H200, for the lead's GPU call: the GPU test module cuda_down8
# (expert_down_combine_f32 = its twin = the unfused expert_down + fold_slots + combine_owned bit
# for bit; the door's runs on edge at TP1 and co-resident TP2 = host, census = host), then `run`
# of the door with NVFP4_EP2 (its requirement) at TP1/2 over every transport, and
# `matrix --explain` for its exclusions (TP4/8: NVFP4_EP2's 2 owners).
set -uo pipefail
source scripts/gpu/libs.sh
gpu_call down8
steps_start "${FINAL_DEADLINE:-540}"
step gpu_down8 150 $T --test-threads=1 cuda_down8
grep -E "^test |^test result" /tmp/gpu_down8.log | tail -8; grep -E "panicked" -A5 /tmp/gpu_down8.log | head -20
step seldown8 120 $G run --backend cuda --door MEMRA_SEL_DOWN8 --door MEMRA_STEP_NVFP4_EP2 --tp 1,2 --quiet --out /tmp/seldown8
tail -3 /tmp/seldown8.log
step explain 20 $G matrix --matrix all --backend cuda --explain
grep -E "sel_down8" /tmp/explain.log | grep -E "EXCLUDED|NOT-APPLICABLE" | head -10
tar czf $OUT/down8.tgz -C /tmp $(cd /tmp && ls -d *.log seldown8 2>/dev/null) 2>/dev/null
echo "done in $(( $(date +%s)-STEPS_START ))s"
