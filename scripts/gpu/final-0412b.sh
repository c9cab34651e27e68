#!/usr/bin/env bash
# 2026-12-04 (second session), the last call: the final build's GPU modules that its kernels touch
# (cuda_step, with fold_combine's new multi-batch cases; the lane grid), ncu's detail on one
# expert_gate_up_f32 launch (what limits it: speed of light, occupancy, warp stalls), and a
# long single-process `--matrix all` sample on tiny (shard 3/16, interrupted after 240 s; its
# receipts give the steady-state rate per TP with the engagement baselines shared).
set -uo pipefail
source scripts/gpu/libs.sh
gpu_call final-0412b
gpu_tools
steps_start "${FINAL_DEADLINE:-420}"
gpu_modules cuda_step:: cuda_lane_grid::
if [ -n "$NCU" ]; then
  step ncu_detail 60 $NCU --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \
    -k regex:expert_gate_up_f32 --launch-skip 4 --launch-count 1 $G bench --backend cuda --preset step --layers 2 --batch 1 --no-torch --out /tmp/ncudetail
  cp /tmp/ncu_detail.log $OUT/ncu-expert-gate-up-detail.txt
  grep -E "Throughput|Duration|Registers|Achieved Occupancy|Theoretical Occupancy|Stall|Warp Cycles|Block Limit|Waves" /tmp/ncu_detail.log | head -40
fi
t0=$(date +%s)
timeout -s INT 240 $G run --matrix all --backend cuda --preset tiny --shard 3/16 --quiet --out /tmp/long > /tmp/long.log 2>&1
echo "long sample: exit $? in $(( $(date +%s)-t0 ))s; receipts: $(ls /tmp/long/run-*.json 2>/dev/null | wc -l)"
tail -3 /tmp/long.log
mkdir -p /tmp/longr && cp /tmp/long/run-*.json /tmp/longr/ 2>/dev/null
tar czf $OUT/final-0412b.tgz -C /tmp $(cd /tmp && ls *.log 2>/dev/null) longr 2>/dev/null
echo "done in $(( $(date +%s)-STEPS_START ))s"
