#!/usr/bin/env bash
# The experts' shared slot ahead of the wait (branch ahead, eleventh session, 2026-12-05), with
# the read-ceiling and PDL-chain microbenchmarks first. One call of about 8 minutes:
#   bash scripts/gpu/ahead.sh [S]   read_ceiling + pdl_chain; b1 of main and ahead interleaved
#                                   (three rounds); ahead's whole GPU binary with the step-preset
#                                   gate; b8 of both; selftest of ahead; ncu of both at b1; on an
#                                   H200, main's b1 and b8 with the PyTorch anchor in the time left
# Carry target-g/ (`carry.sh main`, `carry.sh ahead /work/ahead`). ahead lands if its b1 layer beats
# main's in every round and its whole GPU binary passes.
set -uo pipefail
source scripts/gpu/libs.sh
call_start ahead "${1:-560}"
B=target-g
nvcc_build pdl_build pdl_chain scripts/gpu/pdl_chain_bench.cu
read_ceiling 60 .
step pdl_run 40 /tmp/pdl_chain 40; cat /tmp/pdl_run.log
b1_rounds 3 main ahead
whole_gpu ahead 200
for v in main ahead; do bench_step b8-$v $B/mg-$v 8; done
selftest_cuda ahead 40
for v in main ahead; do ncu_b1 ncu-b1-$v 30 $B/mg-$v all; done
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  for b in 1 8; do
    step shape-b$b 100 $B/mg-main bench --backend cuda --preset step --layers 2 --graph --batch $b --out /tmp/shape-b$b
    echo "shape-b$b: $(bench_summary /tmp/shape-b$b.log)"; grep -E "per token|fastest form|overhead" /tmp/shape-b$b.log | head -4
  done
fi
tar czf $OUT/ahead.tgz -C /tmp $(cd /tmp && ls read_run.log pdl_run.log gpu_*.log selftest.log b1-*.log b8-*.log ncu-*.log shape-*.log 2>/dev/null) \
  $(cd /tmp && ls -d b1-* b8-* shape-b* 2>/dev/null | grep -v log)
echo "done in $(( $(date +%s)-STEPS_START ))s"
