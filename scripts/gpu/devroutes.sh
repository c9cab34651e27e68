#!/usr/bin/env bash
# Issue 29's NVFP4_DEV_ROUTES and the per-layer SwiGLU clamp on one H200: the twin tests of the
# kernels they changed (the grouped gate/up with the folded up scale, combine_scaled, the lane
# grid), the door's `run` on tiny and edge (co-resident TP1/2/4/8, every transport), and a
# `--matrix single` night on tiny and edge (every door alone, edge's layer 1 now unclamped).
# Receipts of the door run come back so host and device evidence can be compared here.
set -uo pipefail
source scripts/gpu/libs.sh
gpu_call devroutes
steps_start "${FINAL_DEADLINE:-570}"
step gpu_grouped 60 $T --test-threads=1 grouped_expert_kernels_match_twins
grep -E "^test |^test result" /tmp/gpu_grouped.log | tail -3; grep -E "panicked" -A6 /tmp/gpu_grouped.log | head -20
step gpu_join 60 $T --test-threads=1 moe_join_and_residual_kernels_match_twins
grep -E "^test |^test result" /tmp/gpu_join.log | tail -3; grep -E "panicked" -A6 /tmp/gpu_join.log | head -20
step devroutes 90 $G run --backend cuda --door MEMRA_STEP_NVFP4_DEV_ROUTES --quiet --out /tmp/devroutes
tail -3 /tmp/devroutes.log; grep -h -E "VOID|FAIL|ERROR" /tmp/devroutes.log | head -6
mkdir -p $OUT/devroutes && cp -r /tmp/devroutes/*.json /tmp/devroutes/edge $OUT/devroutes/ 2>/dev/null
step gpu_lane_grid 40 $T --test-threads=1 cuda_lane_grid
grep -E "^test |^test result" /tmp/gpu_lane_grid.log | tail -4; grep -E "panicked" -A6 /tmp/gpu_lane_grid.log | head -20
step single 300 $G run --matrix single --backend cuda --quiet --out /tmp/single
tail -3 /tmp/single.log; grep -h -E "VOID|FAIL|ERROR" /tmp/single.log | head -10
cp /tmp/single/summary.json $OUT/single-tiny-summary.json 2>/dev/null; cp /tmp/single/edge/summary.json $OUT/single-edge-summary.json 2>/dev/null
tar czf $OUT/devroutes.tgz -C /tmp $(cd /tmp && ls *.log) 2>/dev/null
echo "done in $(( $(date +%s)-STEPS_START ))s"
