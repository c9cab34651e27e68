#!/usr/bin/env bash
# The block-per-lane E4M3 kernels (issue 27): every GPU module that compares an E4M3 kernel with
# its host twin, the grouped-expert and GEMV bandwidth reports, bench at b1 and b8, and ncu's
# per-kernel time of one b1 bench. Full logs in $OUT/e4m3bpl.tgz, a short table last.
set -uo pipefail
source scripts/gpu/libs.sh
gpu_call e4m3bpl
NCU=$(ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
steps_start "${E4M3BPL_DEADLINE:-420}"
step kernels 60 $T --test-threads=1 cuda_kernels::
step step 90 $T --test-threads=1 cuda_step::
step lane_grid 40 $T --test-threads=1 cuda_lane_grid::
grep -h "test result" /tmp/kernels.log /tmp/step.log /tmp/lane_grid.log
grep -hE "panicked|FAILED" -A4 /tmp/kernels.log /tmp/step.log /tmp/lane_grid.log | head -20
export MEMRA_GPU_BENCH=1
step experts_bw 40 $T --exact cuda_step::grouped_experts_bandwidth_report
grep -E "bench|GB/s" /tmp/experts_bw.log | head -8
step gemv_bw 60 $T --exact cuda_kernels::gemv_bandwidth_report
unset MEMRA_GPU_BENCH
grep -E "e4m3" /tmp/gemv_bw.log | head -8
for shape in "--batch 1" "--batch 8"; do
  n=bench$(echo $shape | tr -d ' -'); step $n 35 $G bench --backend cuda --preset step --layers 2 --graph $shape --out /tmp/$n
  grep -E "^[01] |L0: .*per token|experts" /tmp/$n.log | head -8
done
if [ -n "$NCU" ]; then
  step ncu 90 $NCU --metrics gpu__time_duration.sum --csv --launch-skip 200 --launch-count 60 $G bench --backend cuda --preset step --layers 2 --batch 1 --out /tmp/ncubench
  cp /tmp/ncu.log $OUT/ncu-b1.csv
  grep -E '"(expert|gemv|router|rmsnorm|add_rmsnorm|fold|argmax)' /tmp/ncu.log | awk -F'","' '{k=$5; sub(/\(.*/,"",k); v=$NF; gsub(/[",]/,"",v); s[k" "$(NF-1)]+=v; n[k" "$(NF-1)]++} END {for (k in s) printf "%-40s %4d launches  mean %9.1f\n", k, n[k], s[k]/n[k]}' | sort
fi
tar czf $OUT/e4m3bpl.tgz -C /tmp $(cd /tmp && ls *.log 2>/dev/null) bench1 bench8 2>/dev/null
echo "done in $(( $(date +%s)-STEPS_START ))s"
