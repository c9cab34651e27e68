#!/usr/bin/env bash
# The experts' gate/up rows interleaved across blocks (branch inter, on branch ahead), eleventh
# session, 2026-12-06. One call of about 6 minutes:
#   bash scripts/gpu/inter.sh [S]   read_ceiling (with the interleaved GEMV, loads only and whole);
#                                   b1 of main, ahead and inter interleaved (three rounds); inter's
#                                   whole GPU binary with the step-preset gate; b8 of main and
#                                   inter; selftest of inter
# Carry target-g/ (`carry.sh main`, `carry.sh ahead /work/ahead`, `carry.sh inter /work/inter`).
set -uo pipefail
source scripts/gpu/libs.sh
call_start inter "${1:-560}"
B=target-g
NV=("$NVCC" -O3 -std=c++17 -arch=sm_90 --fmad=false -ftz=false -prec-div=true -prec-sqrt=true -I kernels/cuda)
step read_build 60 "${NV[@]}" -o /tmp/read_ceiling scripts/gpu/read_ceiling_bench.cu; tail -3 /tmp/read_build.log
step read_run 60 /tmp/read_ceiling; grep -E "TB/s|bpl|GEMV's buffer" /tmp/read_run.log
for round in 0 1 2; do
  for v in main ahead inter; do bench_step b1-$v-$round $B/mg-$v 1; done
done
step gpu_inter 200 env MEMRA_GPU_STEP=1 $B/gpu-inter --test-threads=1
grep -E "^test result|step preset device-host|shared slot ahead|panicked" -A3 /tmp/gpu_inter.log | head -12
for v in main inter; do bench_step b8-$v $B/mg-$v 8; done
step selftest 40 $B/mg-inter selftest --backend cuda --out /tmp/selftest
grep -E "canary was caught|NOT CAUGHT|MISSED" /tmp/selftest.log | head -3
cp /tmp/selftest/summary.md "$OUT/selftest-cuda-summary.md" 2>/dev/null
tar czf $OUT/inter.tgz -C /tmp $(cd /tmp && ls read_run.log gpu_*.log selftest.log b1-*.log b8-*.log ncu-*.log 2>/dev/null) \
  $(cd /tmp && ls -d b1-* b8-* 2>/dev/null | grep -v log)
echo "done in $(( $(date +%s)-STEPS_START ))s"
