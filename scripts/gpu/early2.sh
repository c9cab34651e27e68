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
for round in 0 1; do
  for v in main early earlyn; do bench_step b1-$v-$round $B/mg-$v 1; done
done
step gpu_earlyn 110 env MEMRA_GPU_STEP=1 $B/gpu-earlyn --test-threads=1
grep -E "^test result|step preset device-host|panicked" /tmp/gpu_earlyn.log | head -8
step selftest 20 $B/mg-earlyn selftest --backend cuda --out /tmp/selftest
grep -E "canary was caught|NOT CAUGHT|MISSED" /tmp/selftest.log | head -3
for v in main early earlyn; do bench_step b8-$v $B/mg-$v 8; done
tar czf $OUT/early2.tgz -C /tmp $(cd /tmp && ls gpu_*.log selftest.log b1-*.log b8-*.log 2>/dev/null)
echo "done in $(( $(date +%s)-STEPS_START ))s"
