#!/usr/bin/env bash
# The next call for issues 27 and 24 (prepared in the fifth session, 2026-12-04, while no device
# was lent), one call of about 8 minutes:
#  1. scripts/gpu/e4m3_tma_bench.cu: the expert GEMV shape with persistent blocks, half pairs and
#     codes through a `cp.async.bulk` ring in shared memory, every row checked against the host —
#     what the next expert kernel should be built on;
#  2. the call owed since the fourth session (docs/gpu/2026-12-04-bplonly/): c (the block-per-lane-only expert kernels at 5
#     blocks per SM, 48 registers) through the whole GPU test binary and `selftest --backend cuda`,
#     b1/b8 bench interleaved with d (6 per SM) and e (today's main: 4 per SM);
#  3. the host side of a configuration's runs on one lane's `--matrix all` shard (TP2 native-p2p,
#     31 configurations of tiny): a0 (aa9c0ed: every run timed) against m (main: the determinism
#     re-run and the baselines without timing marks) against e (m + the collect patch: marks read with one cuEventElapsedTime each, not cudarc's bind + two
#     event syncs + elapsed) — the patch lands only if e is faster than m;
#  4. ncu of c's b1 bench at the card's own clocks, and the single-row kernels without ncu's
#     cache flush.
# Carry target-next/ (about 54 MB), each binary `strip`ped, built on the dev machine:
#   mg-a0  aa9c0ed;  mg-m  main;  mg-e  main + the collect patch (landed in the sixth session: `safe::elapsed_ms_completed`);
#   mg-c   e with both `__launch_bounds__(GEMV_THREADS, 4)` of the `*_bpl_f32` kernels in
#          kernels/cuda/experts.cu at 5, and its GPU test binary (`cargo test --release -p
#          memra-runtime --test gpu --no-run`); mg-d the same at 6.
set -uo pipefail
source scripts/gpu/libs.sh
gpu_call experts-next
gpu_tools
T=$(ls target-next/gpu-* | head -1)
steps_start "${1:-570}"

step tma_build 60 "$NVCC" -O3 -std=c++17 -arch=sm_90 --fmad=false -ftz=false -prec-div=true -prec-sqrt=true \
  -I kernels/cuda -o /tmp/e4m3_tma scripts/gpu/e4m3_tma_bench.cu
tail -3 /tmp/tma_build.log
step tma_bench 100 timeout 90 /tmp/e4m3_tma   # a hung mbarrier wait must not eat the call
cat /tmp/tma_bench.log

gpu_modules ""   # the whole GPU test binary (c), into /tmp/gpu_.log
step selftest 90 target-next/mg-c selftest --backend cuda --out /tmp/selftest
grep -E "canary was caught|NOT CAUGHT|MISSED|canaries" /tmp/selftest.log | head -5

for v in e c d e c; do
  n=b1-$v-$(ls /tmp/b1-$v-*.log 2>/dev/null | wc -l); step $n 40 target-next/mg-$v bench --backend cuda --preset step --layers 2 --graph --no-torch --batch 1 --out /tmp/$n
  echo "$n: $(bench_summary /tmp/$n.log)"
done
for v in e c; do
  n=b8-$v; step $n 40 target-next/mg-$v bench --backend cuda --preset step --layers 2 --graph --no-torch --batch 8 --out /tmp/$n
  echo "$n: $(bench_summary /tmp/$n.log)"; grep -E "per token" /tmp/$n.log | head -2
done

# One lane's shard (TP2 native-p2p, 31 configurations on tiny): wall and the median run phase.
run_ms() {
  python3 -c 'import json,glob,statistics as s,sys
v=[json.load(open(f))["measurements"]["extra"].get("phase_run_ms") for f in glob.glob(sys.argv[1]+"/run-*.json")]
v=[x for x in v if x is not None]; print("%d receipts, median phase_run_ms %.1f" % (len(v), s.median(v)) if v else "no receipts")' "$1"
}
for v in a0 m e a0; do
  n=shard-$v-$(ls /tmp/shard-$v-*.log 2>/dev/null | wc -l); t0=$(date +%s%N)
  step $n 40 target-next/mg-$v run --matrix all --backend cuda --preset tiny --tp 2 --transport native-p2p \
    --shard 3/256 --quiet --out /tmp/$n
  echo "$n: wall $(awk -v a="$t0" -v b="$(date +%s%N)" 'BEGIN {printf "%.1f", (b - a) / 1e9}') s; $(run_ms /tmp/$n); $(tail -1 /tmp/$n.log)"
done

echo "ncu c:"; ncu_b1 "ncu-b1-c" 40 "target-next/mg-c"
# The single-row kernels again without ncu's cache flush (their input row was just written by the
# kernel before them, as in the step): both readings go in the log, labelled.
if [ -n "$NCU" ]; then
  step ncu-rows-warm 40 "$NCU" --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv \
    --kernel-name regex:"rmsnorm|router_topk|argmax|fold_combine" --launch-skip 40 --launch-count 40 \
    target-next/mg-c bench --backend cuda --preset step --layers 2 --batch 1 --no-torch --out /tmp/ncu-rows-warm-bench
  cp /tmp/ncu-rows-warm.log "$OUT/ncu-rows-warm.csv"; echo "single-row kernels, caches not flushed:"; ncu_means /tmp/ncu-rows-warm.log
fi
cp /tmp/selftest/summary.md "$OUT/selftest-cuda-summary.md" 2>/dev/null
tar czf $OUT/experts-next.tgz -C /tmp $(cd /tmp && ls tma_*.log b1-*.log b8-*.log shard-*.log gpu_.log selftest.log 2>/dev/null) 2>/dev/null
echo "done in $(( $(date +%s)-STEPS_START ))s"
