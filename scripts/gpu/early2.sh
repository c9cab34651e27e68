#!/usr/bin/env bash
# Which half of branch early earns its place (tenth session, 2026-12-05): call 1 of early.sh found
# early's b1 layer 0.6–2.9 µs faster than main's in every round while ncu (kernels serialized, no
# overlap) timed its BF16 GEMVs 0.6–0.8 µs slower each (62–64 registers: 4 blocks per SM instead
# of 5). earlyn = early with the GEMVs back to kernel_entry() first (only the norms load weights
# before the wait). One call of about 4 minutes (timeout_s 320):
#   bash scripts/gpu/early2.sh [S]   b1 of main, early and earlyn interleaved (two rounds), earlyn's
#                                    whole GPU binary and selftest, then b8 of each while time is left
# Carry target-g/: mg-main, mg-early (as early.sh), mg-earlyn / gpu-earlyn = branch earlyn.
set -uo pipefail
source scripts/gpu/libs.sh
call_start early2 "${1:-290}"
B=target-g
b1_rounds 2 main early earlyn
whole_gpu earlyn 110
selftest_cuda earlyn 20
for v in main early earlyn; do bench_step b8-$v $B/mg-$v 8; done
tar czf $OUT/early2.tgz -C /tmp $(cd /tmp && ls gpu_*.log selftest.log b1-*.log b8-*.log 2>/dev/null)
echo "done in $(( $(date +%s)-STEPS_START ))s"
