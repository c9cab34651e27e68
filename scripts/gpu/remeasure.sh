#!/usr/bin/env bash
# Main re-measured as one build (tenth session, 2026-12-05): issue 27's "done means" asks for the
# target table, ncu's per-kernel table and every module of the GPU test binary from one call on the
# same build. One call of about 9 minutes (timeout_s 600):
#   [NAME=main] [SHORT=1] bash scripts/gpu/remeasure.sh [S]   (SHORT: b1 with the anchor, ncu, the
#                                       whole GPU binary, selftest only: about 330 s)
#   without SHORT:   b1 with the PyTorch anchor, a second b1, ncu of one b1 bench, issue 27's
#                                       target table from the two (bench --targets; SHORT too),
#                                       the whole GPU binary with the step-preset gate, b8 with the
#                                       PyTorch anchor, selftest, then issue 24's other shapes
#                                       (t8, b2, b4, t2, t4; no PyTorch) and b8 with the rows' door
#                                       DECODE_V2 (the form a batched-serving user runs) while time is left;
#                                       after selftest, what a kernel that only reads reaches at each
#                                       seam's size on this card (read_ceiling: never measured on an
#                                       H200, it says how near the experts and qkv targets can come)
#                                       and, for each of $CANDS carried as target-g/mg-CAND, b1 main / CAND x2
# Carry target-g/ (`bash scripts/gpu/carry.sh NAME` builds it: mg-NAME = memra-gates, gpu-NAME =
# the runtime's GPU test binary, stripped; NAME defaults to main). Measured first at 02e752d (docs/gpu/2026-12-05-remeasure/).
set -uo pipefail
source scripts/gpu/libs.sh
call_start remeasure "${1:-565}"
B=target-g; N=${NAME:-main}
bench_shape() { # NAME NEED_S FLAGS...
  local name=$1 need=$2; shift 2
  step "$name" "$need" $B/mg-$N bench --backend cuda --preset step --layers 2 --graph "$@" --out "/tmp/$name"
  echo "$name: $(bench_summary "/tmp/$name.log")"
  grep -E "per token|fastest form|overhead" "/tmp/$name.log" | head -4
}
finish() {
  pack_logs remeasure.tgz 'gpu_*.log' selftest.log targets.log 'b1-*' 'shape-*' 'ncu-*.log' 'read_*.log' 'm-*'
  echo "done in $(( $(date +%s)-STEPS_START ))s"
}
if [ -n "${SHORT:-}" ]; then  # issue 27's "done means" alone, for a call near the end of the budget
  bench_shape shape-b1 100 --batch 1
  ncu_b1 "ncu-b1-$N" 50 $B/mg-$N
  targets_b1 $B/mg-$N /tmp/shape-b1 "/tmp/ncu-b1-$N.log"
  whole_gpu "$N" 180
  selftest_cuda "$N" 30
  finish; exit
fi
bench_shape shape-b1 100 --batch 1
bench_shape b1-again 40 --no-torch --batch 1
ncu_b1 "ncu-b1-$N" 60 $B/mg-$N
targets_b1 $B/mg-$N /tmp/shape-b1 "/tmp/ncu-b1-$N.log"  # the target table of this call
whole_gpu "$N" 240
bench_shape shape-b8 100 --batch 8
selftest_cuda "$N" 40
# The read ceiling replaces the one-grid experts probe here (the route it measured is closed:
# docs/gpu/2026-12-07-fuse/; `experts_fuse_probe` in libs.sh still runs it).
read_ceiling 40 "copy|stream U=8|bpl|variant"
# Candidate builds carried beside main (target-g/mg-CAND for each CAND in $CANDS) get two b1
# rounds interleaved with main on the same card before the other shapes; a candidate not carried
# is left out.
cands=()
for c in ${CANDS:-}; do [ -x "$B/mg-$c" ] && cands+=("$c"); done
if [ ${#cands[@]} -gt 0 ]; then
  for r in 0 1; do for v in "$N" "${cands[@]}"; do bench_step "m-$v-$r" "$B/mg-$v" 1; done; done
  seam_table m-
fi
bench_shape shape-t8 40 --no-torch --columns 8
bench_shape shape-b2 40 --no-torch --batch 2
bench_shape shape-b4 40 --no-torch --batch 4
bench_shape shape-t2 40 --no-torch --columns 2
bench_shape shape-t4 40 --no-torch --columns 4
bench_shape shape-b8-v2 40 --no-torch --batch 8 --door decode_v2 --door f32_mirror
finish
