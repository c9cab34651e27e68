#!/usr/bin/env bash
# Weights ahead, side stream, twenty-fifth session, third call. Call 2's side form forked its
# prefetch off the rank's stream at each window; the gated layer kept only ~1.5 of the ~4 µs the
# seam-timed run showed. side2 (side2.patch) forks no edge from the rank's chain: in a graph each
# prefetch kernel waits on the side stream (joined at the capture's start) for its window's flag,
# written by the window's first kernel after its wait. Interleaved with main and side, two
# rounds; side with and without the prefetch under --serialized-launches (no programmatic edge
# to lose); side2's no-bit test and the step-preset gate.
#   bash docs/gpu/2026-12-07-ahead/side2.sh S   carry ["target-g"] with mg-main, mg-side, mg-side2, gpu-side2
set -uo pipefail
source scripts/gpu/libs.sh
call_start side2 "${1:-300}"
# Most informative first (a short call skips the tail): round 0, side2's no-bit test, round 1.
for v in main side2 side; do bench_step "c3-$v-0" "target-g/mg-$v" 1; done
step gpu_side2_launch 20 target-g/gpu-side2 --test-threads=1 cuda_launch::weights_ahead
grep -E "^test result|weights ahead into L2|panicked" -A3 /tmp/gpu_side2_launch.log | head -6
for v in main side2 side; do bench_step "c3-$v-1" "target-g/mg-$v" 1; done
bench_step "c3-side-ser-on" target-g/mg-side 1 --serialized-launches
bench_step "c3-side-ser-off" target-g/mg-side 1 "--serialized-launches --no-weights-ahead"
step gpu_side2_step 45 target-g/gpu-side2 --test-threads=1 cuda_step::
grep -E "^test result|panicked" -A3 /tmp/gpu_side2_step.log | head -6
seam_table c3-
for b in /tmp/c3-*.log; do echo "$(basename "$b" .log): $(layer_rows "$b")"; done
pack_logs side2.tgz 'c3-*' 'gpu_*.log'
echo "side2 part done in $(( $(date +%s)-STEPS_START ))s"
