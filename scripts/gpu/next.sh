#!/usr/bin/env bash
# The next call for issue 27 (prepared at the end of the sixth session, 2026-12-05, when the
# session's device time was spent; ran in the seventh, 494 s: docs/gpu/2026-12-05-pdl/call1),
# one call of about 8 minutes:
#  1. the whole GPU test binary on main (head: 6 blocks per SM, argmax batched over 128 blocks)
#     with the step-preset device-host gate (MEMRA_GPU_STEP=1) — argmax's change went only
#     through `cuda_kernels::` and the step-shape argmax twins;
#  2. the single-row floor (scripts/gpu/row_floor_bench.cu): an empty kernel, a one-block copy of
#     a 4096-wide row and a norm-shaped chain, event-timed back to back and under ncu with and
#     without its cache flush — is ≤ 3 µs of ncu's gpu__time_duration reachable on this card?
#  3. head against v86 (gate/up at 8 blocks per SM, down at 6: the best b8 pass on 2026-12-05,
#     319.6–321.2 µs against 337.1–337.4, 0.5 % slower at b1), b1 and b8 interleaved, then v86
#     through the whole GPU test binary: it lands if b8 holds and b1 does not lose.
# Carry target-next/ (about 27 MB), each binary `strip`ped, built on the dev machine at 2682edd:
#   mg-head, gpu-head  main (`cargo build --release`; `cargo test --release -p memra-runtime
#                      --test gpu --no-run`);
#   mg-v86, gpu-v86    the same with expert_gate_up_bpl_f32's `__launch_bounds__(GEMV_THREADS, 6)`
#                      in kernels/cuda/experts.cu at 8.
set -uo pipefail
source scripts/gpu/libs.sh
gpu_call next
gpu_tools
steps_start "${1:-560}"

step gpu_head 200 env MEMRA_GPU_STEP=1 target-next/gpu-head --test-threads=1
grep -E "^test result|step preset device-host|panicked" /tmp/gpu_head.log | head -8

row_floor

for round in 0 1; do
  for v in head v86; do
    bench_step b1-$v-$round target-next/mg-$v 1
    bench_step b8-$v-$round target-next/mg-$v 8
  done
done
step gpu_v86 200 env MEMRA_GPU_STEP=1 target-next/gpu-v86 --test-threads=1
grep -E "^test result|step preset device-host|panicked" /tmp/gpu_v86.log | head -8
tar czf $OUT/next.tgz -C /tmp $(cd /tmp && ls gpu_head.log gpu_v86.log floor_*.log b1-*.log b8-*.log 2>/dev/null)
echo "done in $(( $(date +%s)-STEPS_START ))s"
