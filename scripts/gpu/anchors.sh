#!/usr/bin/env bash
# The PyTorch anchor at every pass shape (seventeenth session, 2026-12-06): `bench` runs
# scripts/bench/torch_layer.py for rows AND verify columns, with every form — the BF16 gathers, the
# grouped GEMM (`grouped_mm`), the FP8 forms — so each shape gets "PyTorch, same pass (fastest
# form)". One call of 3-5 minutes (docs/gpu/2026-12-06-anchors/):
#   [NAME=main] [NCU_TOO=0] [SHAPES="b1 b8 ..."] bash scripts/gpu/anchors.sh [S]
# SHAPES default: b1 b8 t8 t2 t4 b2 b4, each `bench ... --graph --batch B | --columns T` with the
# anchor; then (NCU_TOO=1, the default) ncu of one b1 bench with the caches flushed and not, while
# time is left. Carry target-g/ (`bash scripts/gpu/carry.sh NAME`); logs and receipts packed into
# $OUT/anchors.tgz.
set -uo pipefail
source scripts/gpu/libs.sh
call_start anchors "${1:-560}"
B=target-g; N=${NAME:-main}
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))"
anchor_shape() { # NAME NEED_S FLAGS...
  local name=$1 need=$2; shift 2
  step "$name" "$need" $B/mg-$N bench --backend cuda --preset step --layers 2 --graph "$@" --out "/tmp/$name"
  echo "$name: $(bench_summary "/tmp/$name.log")"
  grep -E "per token|fastest form|the anchor|not timed|not run|overhead" "/tmp/$name.log" | head -8
}
# SHAPES: which, in order (default all seven).
for shape in ${SHAPES:-b1 b8 t8 t2 t4 b2 b4}; do
  case $shape in
    b*) anchor_shape "anchor-$shape" 70 --batch "${shape#b}" ;;
    t*) anchor_shape "anchor-$shape" 70 --columns "${shape#t}" ;;
  esac
done
if [ "${NCU_TOO:-1}" = 1 ]; then
ncu_b1 "ncu-b1-$N" 60 $B/mg-$N
# The same launches with the caches as the layer leaves them (no flush): a row kernel reads what the
# kernel before it just wrote, from L2.
ncu_b1 "ncu-b1-warm-$N" 60 $B/mg-$N none
fi
pack_logs anchors.tgz 'anchor-*' 'ncu-*.log'
echo "done in $(( $(date +%s)-STEPS_START ))s"
