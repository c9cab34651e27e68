#!/usr/bin/env bash
# Twenty-seventh session, one call on any card: (1) the experts seam as one launch, a probe outside
# the runtime (scripts/gpu/experts_fuse_bench.cu: bits against the shipped split launches, then µs
# per layer of split / fused, three interleaved rounds); (2) attn2 with the seconds left
# (docs/gpu/2026-12-07-attn/attn.sh with V=attn2: b1 interleaved with main, the attention twin
# tests, the whole GPU binary, a second b1 round, the longer context, b8).
#   bash docs/gpu/2026-12-07-fuse/call.sh S     carry ["target-g"] with mg-main, mg-attn2, gpu-attn2
#   PROBE_ONLY=1 bash docs/gpu/2026-12-07-fuse/call.sh S    (1) only
set -uo pipefail
source scripts/gpu/libs.sh
call_start fuse "${1:-500}"
experts_fuse_probe
pack_logs fuse.tgz 'fuse_*.log'
[ -n "${PROBE_ONLY:-}" ] && { echo "done in $(( $(date +%s)-STEPS_START ))s"; exit 0; }
V=${V:-attn2} bash docs/gpu/2026-12-07-attn/attn.sh "$(left)"
