#!/usr/bin/env bash
# The twentieth session's two kernel changes, prepared when no machine started
# (docs/gpu/2026-12-06-prepared/): `next` = main + fcr.patch (the moe_join's kernel computes the
# residual: one dependent launch fewer per layer) + attn.patch (attention's key rows and values
# loaded one batch per round trip, not one position or half a partition per round trip) + cols.patch
# (SPEC_FA2's two-column kernel walks its keys the same way; the single-lane kernels' SASS is
# unchanged by it); `attn` = main + attn.patch alone.
# Build here first (target-g/ is ignored; carry ["target-g"]: these five binaries are about 40 MB,
# the tree about 18 MB, so nothing else may sit in target-g under the 64 MiB limit):
#   rm -rf target-g; bash scripts/gpu/carry.sh main
#   for b in next attn; do git worktree add /work/$b HEAD; done
#   git -C /work/next apply "$PWD"/docs/gpu/2026-12-06-prepared/{fcr,attn,cols}.patch
#   git -C /work/attn apply "$PWD/docs/gpu/2026-12-06-prepared/attn.patch"
#   bash scripts/gpu/carry.sh next /work/next; bash scripts/gpu/carry.sh attn /work/attn; rm target-g/gpu-attn
# Then one call, most needed first within each mode:
#   bash scripts/gpu/prepared20.sh full [S]   either card: b1 rounds main / attn / next, the GPU test
#                                             modules the changes touch, selftest, a b8 round, ncu of
#                                             one b1 bench of main and of next (every kernel), the
#                                             single-token door matrix (tiny, edge)
#   bash scripts/gpu/prepared20.sh h200 [S]   an H200: what issue 27's table needs from one build —
#                                             b1 rounds, ncu, the whole GPU binary, selftest, b8, the
#                                             PyTorch anchor at b1
#   bash scripts/gpu/prepared20.sh min [S]    little device time left: the test modules, b1 rounds
#                                             main / next, selftest
set -uo pipefail
source scripts/gpu/libs.sh
mode=${1:?usage: prepared20.sh full|h200|min [S]}
call_start "prepared20-$mode" "${2:-560}"
T=target-g/gpu-next
modules() { step_module next 80; gpu_modules cuda_kernels:: cuda_lane_grid::; } # the modules the changes touch
case $mode in
  full)
    b1_rounds 2 main attn next
    modules
    gpu_modules cuda_passes:: # cols.patch: SPEC_FA2's kernel against the host oracle (t2)
    selftest_cuda next 45
    pass_rounds 1 8 main next
    ncu_bench ncu-b1-main 45 target-g/mg-main all 1 200 80 "[a-z]"
    ncu_bench ncu-b1-next 45 target-g/mg-next all 1 200 80 "[a-z]"
    step single 200 target-g/mg-next run --matrix single --backend cuda --quiet --out /tmp/single
    tail -4 /tmp/single.log; cp /tmp/single/summary.md "$OUT/single-summary.md" 2>/dev/null ;;
  h200)
    b1_rounds 2 main attn next
    ncu_bench ncu-b1-next 45 target-g/mg-next all 1 200 80 "[a-z]"
    whole_gpu next 240
    selftest_cuda next 45
    pass_rounds 1 8 main next
    step shape-b1 100 target-g/mg-next bench --backend cuda --preset step --layers 2 --graph --batch 1 --out /tmp/shape-b1
    echo "shape-b1: $(bench_summary /tmp/shape-b1.log)"; grep -E "per token|fastest form|overhead" /tmp/shape-b1.log | head -4 ;;
  min)
    modules
    b1_rounds 2 main next
    selftest_cuda next 45 ;;
  *) echo "prepared20.sh: unknown mode $mode (full, h200, min)" >&2; exit 2 ;;
esac
pack_logs "prepared20-$mode.tgz" 'b1-*' 'b8-*' 'gpu_next*' 'gpu_cuda*' selftest.log single.log 'ncu-*' 'shape-*'
echo "done in $(( $(date +%s)-STEPS_START ))s"
