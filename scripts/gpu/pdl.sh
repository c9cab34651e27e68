#!/usr/bin/env bash
# Programmatic dependent launch (prepared in the seventh session, 2026-12-05, when no device was
# lent after its first call), one call of about 10 minutes (run it with timeout_s 600).
# Carry target-pdl/ (about 40 MB), each binary `strip`ped, built on the dev machine:
#   mg-a   main at 2682edd (target-next/mg-head: plain launches);
#   mg-b   every kernel opens with `kernel_entry()` (griddepcontrol.wait, then
#          launch_dependents) and the runtime launches with programmatic stream serialization
#          (branch `pdl`, 716a450 with the prefetch's asm disabled and rmsnorm as on main);
#   mg-c   b + an L2 prefetch of the block's weight rows before the wait in the BF16 GEMVs
#          (`kernel_entry_prefetch`) + rmsnorm's weights loaded in its row's round trip (716a450);
#   mg-d   c + the shared expert's gate/up and down rows prefetched before the wait in the
#          block-per-lane expert kernels (`shared_slot_span`) + `bench --serialized-launches`
#          (the head of branch `pdl`, the commit that folds the batch selection into batch_pick);
#   gpu-d  d's GPU test binary (`cargo test --release -p memra-runtime --test gpu --no-run`), with
#          `cuda_launch::` (programmatic and serialized launches give the same record).
# Steps: the chain microbenchmark (scripts/gpu/pdl_chain_bench.cu); b1 benches of a, b, c, d and of
# d with --serialized-launches, b8 benches of a and d, interleaved, two rounds (about 16 s each);
# d's whole GPU test binary with the step-preset device-host gate; `selftest --backend cuda` on d;
# ncu of d's b1 (the step skipped first when the deadline is near).
# d lands (with b and c) if its GPU binary passes and its b1 layer beats a's in both rounds.
set -uo pipefail
source scripts/gpu/libs.sh
gpu_call pdl
gpu_tools
steps_start "${1:-580}"
# PDL outside the runtime: a chain of row and weight-streaming kernels in one graph, plain / PDL /
# PDL + L2 prefetch (scripts/gpu/pdl_chain_bench.cu).
step chain_build 40 "$NVCC" -O3 -std=c++17 -arch=sm_90 --fmad=false -ftz=false -prec-div=true -prec-sqrt=true \
  -I kernels/cuda -o /tmp/pdl_chain scripts/gpu/pdl_chain_bench.cu
step chain_run 30 /tmp/pdl_chain; cat /tmp/chain_run.log
for round in 0 1; do
  for v in a b c d; do
    bench_step b1-$v-$round target-pdl/mg-$v 1
  done
  bench_step b1-dser-$round target-pdl/mg-d 1 --serialized-launches
  for v in a d; do
    bench_step b8-$v-$round target-pdl/mg-$v 8
  done
done
step gpu_d 220 env MEMRA_GPU_STEP=1 target-pdl/gpu-d --test-threads=1
grep -E "^test result|step preset device-host|panicked" /tmp/gpu_d.log | head -8
step selftest 60 target-pdl/mg-d selftest --backend cuda --out /tmp/selftest
grep -E "canary was caught|NOT CAUGHT|MISSED" /tmp/selftest.log | head -3
ncu_b1 ncu-b1-d 50 target-pdl/mg-d
tar czf $OUT/pdl.tgz -C /tmp $(cd /tmp && ls chain_*.log b1-*.log b8-*.log gpu_d.log selftest.log 2>/dev/null)
cp /tmp/selftest/summary.md "$OUT/selftest-cuda-summary.md" 2>/dev/null
echo "done in $(( $(date +%s)-STEPS_START ))s"
