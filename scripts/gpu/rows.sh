#!/usr/bin/env bash
# The rows' door sets and the o_proj GEMV's occupancy in one call (fourteenth session, 2026-12-06):
#   bash scripts/gpu/rows.sh S [NIGHT_SHARD]
# b1 of target-g/mg-main and mg-p5 interleaved (two rounds); b8 of main as the default program,
# with DECODE_V2 (+ its F32_MIRROR) and with DCW beside them — the door sets a batched-serving
# user turns on; ncu of one b8 pass of the default program (which launches a pass has); ncu of
# p5 at b1; then, while time is left, a shard of tiny's `--matrix all` timed whole (the night's
# rate on this card). Carry target-g/ with mg-main (this checkout) and mg-p5.
set -uo pipefail
source scripts/gpu/libs.sh
call_start rows "${1:?usage: rows.sh S [NIGHT_SHARD]}"
b1_rounds 2 main p5
M=target-g/mg-main
bench_step b8-main "$M" 8
bench_step b8-v2 "$M" 8 "--door decode_v2 --door f32_mirror"
bench_step b8-v2dcw "$M" 8 "--door decode_v2 --door f32_mirror --door dcw"
ncu_pass ncu-b8-main 8 "$M"
ncu_b1 ncu-b1-p5 30 target-g/mg-p5 all
if [ -n "${2:-}" ]; then
  step night 120 "$M" run --matrix all --backend cuda --preset tiny --shard "$2" --out /tmp/night
  tail -4 /tmp/night.log
  cp /tmp/night.log "$OUT/night.log"
fi
pack_logs rows.tgz 'b1-*' 'b8-*' 'ncu-*.log' 'night.log'
echo "done in $(( $(date +%s)-STEPS_START ))s"
