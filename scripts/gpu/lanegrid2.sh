#!/usr/bin/env bash
# Second call of the lane-grid work: the GPU modules again after the fold was taken out of the
# lane grid (TCOL_OPROJ's mechanism), the whole cuda_step module, bench at b1 and b8, and the
# `--matrix all` time with 8 and 16 concurrent processes on one H200 (matrixtime.sh).
set -uo pipefail
source scripts/gpu/libs.sh
gpu_call lanegrid2
steps_start "${LANEGRID_DEADLINE:-330}"
step matrix8 60 bash scripts/gpu/matrixtime.sh 8 512 0
tail -2 /tmp/matrix8.log
step matrix16 80 bash scripts/gpu/matrixtime.sh 16 512 8
tail -2 /tmp/matrix16.log
step lane_grid 40 $T --test-threads=1 cuda_lane_grid::
step cuda_passes 90 $T --test-threads=1 cuda_passes::
step cuda_step 60 $T --test-threads=1 cuda_step::
grep -h "test result" /tmp/lane_grid.log /tmp/cuda_passes.log /tmp/cuda_step.log; grep -hE "panicked|FAILED" -A4 /tmp/lane_grid.log /tmp/cuda_passes.log /tmp/cuda_step.log | head -10
for shape in "--batch 1" "--batch 8"; do
  n=bench$(echo $shape | tr -d ' -'); step $n 35 $G bench --backend cuda --preset step --layers 2 --graph $shape --out /tmp/$n
  grep -E "^[01] |L0: .*per token" /tmp/$n.log | head -5
done
mkdir -p /tmp/mtlogs; cp /tmp/matrixtime/*/*.log /tmp/mtlogs/ 2>/dev/null
tar czf $OUT/lanegrid2.tgz -C /tmp $(cd /tmp && ls -d *.log mtlogs bench* 2>/dev/null) 2>/dev/null
echo "done in $(( $(date +%s)-STEPS_START ))s"
