#!/usr/bin/env bash
# The single-row kernels and the loads they wait for (eighteenth session, 2026-12-06):
#   [NEW=rowk] [EXTRA="b c"] [R=2] [MICRO=0] [SHAPES="t8 b8"] bash scripts/gpu/rowk.sh [S]
# With NEW (a build carried as target-g/mg-NEW and gpu-NEW beside target-g/mg-main): NEW's GPU
# tests of the kernels it changes (cuda_kernels::, cuda_lane_grid::, then cuda_step:: with the
# step-preset device-host gate) first. Then (MICRO=0 skips it) scripts/gpu/row_kernels_bench.cu:
# this tree's single-row kernels and a rewrite, bits compared, then ncu's duration of every launch
# with the caches flushed and warm. Then the b1 bench of main and NEW interleaved (R rounds), ncu
# of NEW's b1 bench, NEW's selftest and ncu of main's b1 bench; then, with SHAPES, the PyTorch
# anchor at those shapes (scripts/gpu/anchors.sh without its ncu). Every step runs while its time
# is left. EXTRA: more builds (target-g/mg-NAME) in the b1 rounds between main and NEW. Logs:
# docs/gpu/2026-12-06-rowk/.
set -uo pipefail
source scripts/gpu/libs.sh
call_start rowk "${1:-500}"
if [ -n "${NEW:-}" ]; then
  for m in cuda_kernels cuda_lane_grid; do  # the test binary takes one filter
    step "gpu_${NEW}_$m" 60 "target-g/gpu-$NEW" --test-threads=1 "$m::"
    grep -E "^test result|panicked" "/tmp/gpu_${NEW}_$m.log" | head -6
  done
  step_module "$NEW"
fi
if [ "${MICRO:-1}" = 1 ]; then
nvcc_build rowk_build row_kernels scripts/gpu/row_kernels_bench.cu
step rowk_run 30 /tmp/row_kernels 20; cat /tmp/rowk_run.log
RK='(rmsnorm|add_rmsnorm|argmax|fold_combine)'
for cache in all none; do
  step "rowk-ncu-$cache" 40 "$NCU" --clock-control none --cache-control "$cache" --metrics gpu__time_duration.sum \
    --csv --launch-skip 16 --launch-count 80 /tmp/row_kernels 12
  cp "/tmp/rowk-ncu-$cache.log" "$OUT/rowk-ncu-$cache.csv"
  echo "ncu, caches $cache (ns):"; ncu_means "/tmp/rowk-ncu-$cache.log" "$RK"
done
fi
if [ -n "${NEW:-}" ]; then
  b1_rounds "${R:-2}" main ${EXTRA:-} "$NEW"
  ncu_b1 "ncu-b1-$NEW" 40 "target-g/mg-$NEW" all
  selftest_cuda "$NEW" 40
  [ "${MICRO:-1}" = 1 ] && ncu_b1 ncu-b1-main 40 target-g/mg-main all
fi
pack_logs rowk.tgz 'rowk*' 'b1-*' 'ncu-*.log' 'gpu_*.log' 'selftest.log'
echo "row kernels done in $(( $(date +%s)-STEPS_START ))s"
if [ -n "${SHAPES:-}" ] && [ "$(left)" -gt 150 ]; then
  NCU_TOO=0 SHAPES="$SHAPES" NAME="${NAME:-main}" bash scripts/gpu/anchors.sh "$(( $(left) - 10 ))"
fi
