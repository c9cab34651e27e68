#!/usr/bin/env bash
# The rows' rope + append as one lane-grid launch (fourteenth session, 2026-12-06), in one call:
#   bash scripts/gpu/rope.sh S
# b8 of target-g/mg-main and mg-rope interleaved (two rounds), b2/b4 and b1 of both once, b8 of
# rope with DECODE_V2; rope's selftest and whole GPU binary (the lane-grid cases, the step-preset
# gate); then, while time is left, the rows gated on the device (`run` of tiny at b2/b8 over every
# TP and transport, of step at b8, TP1/TP2) and ncu of one rope b8 pass. Carry target-g/ with
# mg-main, mg-rope and gpu-rope (`scripts/gpu/carry.sh NAME [CHECKOUT]`).
set -uo pipefail
source scripts/gpu/libs.sh
call_start rope "${1:?usage: rope.sh S}"
for r in 0 1; do for v in main rope; do bench_step "b8-$v-$r" "target-g/mg-$v" 8; done; done
for b in 2 4 1; do for v in main rope; do bench_step "b$b-$v" "target-g/mg-$v" "$b"; done; done
bench_step b8-rope-v2 target-g/mg-rope 8 "--door decode_v2 --door f32_mirror"
R=target-g/mg-rope
selftest_cuda rope 40
whole_gpu rope 215
grep -E "rope_append" /tmp/gpu_rope.log | head -4
step rows-tiny 60 "$R" run --backend cuda --preset tiny --batch 2,8 --out /tmp/rows-tiny
tail -3 /tmp/rows-tiny.log
step rows-step 90 timeout 90 "$R" run --backend cuda --preset step --layers 2 --gen-tokens 3 --batch 8 --tp 1,2 \
  --transport host-bounce --out /tmp/rows-step
tail -3 /tmp/rows-step.log
ncu_pass ncu-b8-rope 8 "$R"
pack_logs rope.tgz 'b[1248]-*' 'rows-*.log' 'gpu_rope.log' 'selftest*.log' 'ncu-b8-rope.log'
echo "done in $(( $(date +%s)-STEPS_START ))s"
