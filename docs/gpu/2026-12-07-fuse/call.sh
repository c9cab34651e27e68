#!/usr/bin/env bash
# Twenty-seventh session, one call on any card: (1) the experts seam as one launch, a probe outside
# the runtime (scripts/gpu/experts_fuse_bench.cu: bits against the shipped split launches, then µs
# per layer of split / fused, three interleaved rounds); (2) attn2 (docs/gpu/2026-12-07-attn/): b1
# interleaved with main, the attention twin tests, the whole GPU binary, a second b1 round, the
# longer context, b8 — as attn.sh with V=attn2, most informative first.
#   bash docs/gpu/2026-12-07-fuse/call.sh S     carry ["target-g"] with mg-main, mg-attn2, gpu-attn2
#   PROBE_ONLY=1 bash docs/gpu/2026-12-07-fuse/call.sh S    (1) only
set -uo pipefail
source scripts/gpu/libs.sh
V=${V:-attn2}
call_start fuse "${1:-500}"
experts_fuse_probe
[ -n "${PROBE_ONLY:-}" ] && { pack_logs fuse.tgz 'fuse_*.log'; echo "done in $(( $(date +%s)-STEPS_START ))s"; exit 0; }
for v in main $V; do bench_step "a-$v-0" "target-g/mg-$v" 1; done
step gpu_${V}_kernels 20 target-g/gpu-$V --test-threads=1 cuda_kernels::attention
grep -E "^test result|panicked" -A3 /tmp/gpu_${V}_kernels.log | head -6
whole_gpu $V 140
for v in main $V; do bench_step "a-$v-1" "target-g/mg-$v" 1; done
for v in main $V; do bench_step "a-$v-long" "target-g/mg-$v" 1 "--warmup 200"; done
for v in main $V; do bench_step "a-$v-b8" "target-g/mg-$v" 8; done
seam_table a-
for b in /tmp/a-*.log; do echo "$(basename "$b" .log): $(layer_rows "$b")"; done
pack_logs fuse.tgz 'a-*' 'gpu_*.log' 'fuse_*.log'
echo "done in $(( $(date +%s)-STEPS_START ))s"
