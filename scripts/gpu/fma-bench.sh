#!/usr/bin/env bash
# 2026-12-04 (second session), one call: the FMA lane-order microbenchmark (e4m3_fma_bench.cu),
# bench of the step layer at b1 and b8 with the norms' and fold_combine's loads batched (issue 27),
# ncu's per-kernel time of one b1 bench, and a `--matrix all` shard with BULK_P2P ×
# NVFP4_DEV_ROUTES made a registry conflict (issue 24's estimate).
set -uo pipefail
source scripts/gpu/libs.sh
gpu_call fma-bench
gpu_tools
steps_start "${FINAL_DEADLINE:-560}"
build_fma_bench
step fma_bench 60 /tmp/e4m3_fma
cat /tmp/fma_bench.log
for shape in "--batch 1" "--batch 8"; do
  n=bench$(echo $shape | tr -d ' -'); step $n 40 $G bench --backend cuda --preset step --layers 2 --graph --no-torch $shape --out /tmp/$n
  grep -E "^[01] |L0: .*per token|experts|overhead" /tmp/$n.log | head -10
done
if [ -n "$NCU" ]; then
  step ncu 90 $NCU --metrics gpu__time_duration.sum --csv --launch-skip 200 --launch-count 80 $G bench --backend cuda --preset step --layers 2 --batch 1 --no-torch --out /tmp/ncubench
  cp /tmp/ncu.log $OUT/ncu-b1.csv
  ncu_means /tmp/ncu.log
fi
step matrix_shard 100 bash scripts/gpu/matrixtime.sh 1 512 7 $G
cat /tmp/matrix_shard.log
tar czf $OUT/fma-bench.tgz -C /tmp $(cd /tmp && ls *.log 2>/dev/null) bench1 bench8 matrixtime 2>/dev/null
echo "done in $(( $(date +%s)-STEPS_START ))s"
