#!/usr/bin/env bash
# Attention's phase 2 shared out over the block (twenty-sixth session): the partition maxima,
# e_t = exp_c(s_t - m_p) and c_p computed once each instead of by every thread (same bits by
# construction; the twin tests say so on the device). Most informative first (a short call skips
# the tail): b1 interleaved with main, the attention twin tests (a case at the capacity edge,
# 11667 positions), the whole GPU binary with the step-preset gates, a second b1 round, b1 at a
# longer context (--warmup 200: positions 205 to 229 timed), b8 (the rows kernel shares the combine).
#   [V=attn2] bash docs/gpu/2026-12-07-attn/attn.sh S   carry ["target-g"] with mg-main, mg-V, gpu-V (V: attn)
set -uo pipefail
source scripts/gpu/libs.sh
V=${V:-attn}
call_start attn "${1:-500}"
for v in main $V; do bench_step "a-$v-0" "target-g/mg-$v" 1; done
step gpu_${V}_kernels 20 target-g/gpu-$V --test-threads=1 cuda_kernels::attention
grep -E "^test result|panicked" -A3 /tmp/gpu_${V}_kernels.log | head -6
whole_gpu $V 140
for v in main $V; do bench_step "a-$v-1" "target-g/mg-$v" 1; done
for v in main $V; do bench_step "a-$v-long" "target-g/mg-$v" 1 "--warmup 200"; done
for v in main $V; do bench_step "a-$v-b8" "target-g/mg-$v" 8; done
seam_table a-
for b in /tmp/a-*.log; do echo "$(basename "$b" .log): $(layer_rows "$b")"; done
pack_logs attn.tgz 'a-*' 'gpu_*.log'
echo "done in $(( $(date +%s)-STEPS_START ))s"
