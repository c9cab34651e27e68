#!/usr/bin/env bash
# Op::ExpertMlp, the experts seam as one grid in the runtime (mlp.patch), against main, one call on
# any card, most informative first: the probe (scripts/gpu/experts_fuse_bench.cu), b1 main / mlp
# interleaved, the grouped-expert twin test on mlp (the one-grid op twice: the counters' reset),
# the whole GPU binary with the step-preset gate, a second b1 round, b8 (rows: the two launches,
# unchanged), selftest.
#   bash docs/gpu/2026-12-07-fuse/mlp.sh S     carry ["target-g"] with mg-main, mg-mlp, gpu-mlp
set -uo pipefail
source scripts/gpu/libs.sh
call_start mlp "${1:-500}"
experts_fuse_probe
for v in main mlp; do bench_step "m-$v-0" "target-g/mg-$v" 1; done
step gpu_mlp_experts 40 env MEMRA_GPU_STEP=1 target-g/gpu-mlp --test-threads=1 cuda_step::grouped_expert
grep -E "^test result|panicked" -A3 /tmp/gpu_mlp_experts.log | head -6
whole_gpu mlp 150
for v in main mlp; do bench_step "m-$v-1" "target-g/mg-$v" 1; done
for v in main mlp; do bench_step "m-$v-b8" "target-g/mg-$v" 8; done
selftest_cuda mlp 40
seam_table m-
for b in /tmp/m-*.log; do echo "$(basename "$b" .log): $(layer_rows "$b")"; done
pack_logs mlp.tgz 'm-*' 'gpu_*.log' 'fuse_*.log' selftest.log
echo "done in $(( $(date +%s)-STEPS_START ))s"
