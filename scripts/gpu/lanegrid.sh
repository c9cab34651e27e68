#!/usr/bin/env bash
# Lane-grid launches (rows and columns, issue 24 item 6; issue 27's experts) on one H200, one call:
# the lane-grid GPU module, the rows-and-columns modules (device = host, census parity), the
# grouped-expert and norm kernels of cuda_step, selftest on CUDA, bench of the step layer at b1,
# b2, b4, b8 and t8, and one timed shard of `--matrix all` per default
# model (to estimate the whole plan). Each step runs only while the deadline leaves room for it.
# Summary lines to stdout and $OUT/lanegrid.txt, logs and receipts in $OUT/lanegrid.tgz.
set -uo pipefail
source scripts/gpu/libs.sh
gpu_call lanegrid
steps_start "${LANEGRID_DEADLINE:-480}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
step lane_grid 60 $T --test-threads=1 cuda_lane_grid::
grep -E "test result" /tmp/lane_grid.log; grep -E "panicked|failed:|FAILED" -A4 /tmp/lane_grid.log | head -12
step cuda_passes 120 env MEMRA_GPU_STEP=1 $T --test-threads=1 cuda_passes::
grep -E "test result" /tmp/cuda_passes.log; grep -E "panicked|FAILED" -A4 /tmp/cuda_passes.log | head -8
step cuda_lanes 30 $T --test-threads=1 cuda_lanes::
step cuda_step 60 $T --test-threads=1 cuda_step::norms cuda_step::router cuda_step::moe_join cuda_step::grouped_expert_kernels cuda_step::placements
grep -h "test result" /tmp/cuda_lanes.log /tmp/cuda_step.log
for shape in "--batch 1" "--batch 8" "--batch 4" "--batch 2" "--columns 8"; do
  n=bench$(echo $shape | tr -d ' -'); step $n 40 $G bench --backend cuda --preset step --layers 2 --graph $shape --out /tmp/$n
  grep -E "^[01] |L0: .*per token|fastest|gate overhead" /tmp/$n.log | head -5
done
step selftest 60 $G selftest --backend cuda --out /tmp/selftest
tail -3 /tmp/selftest.log
for m in tiny edge; do
  step shard_$m 70 $G run --matrix all --shard 5/64 --preset $m --backend cuda --quiet --out /tmp/shard_$m
  tail -2 /tmp/shard_$m.log
done
tar czf $OUT/lanegrid.tgz -C /tmp $(cd /tmp && ls -d *.log selftest shard_* bench* 2>/dev/null) 2>/dev/null
echo "done in $(( $(date +%s)-STEPS_START ))s"
