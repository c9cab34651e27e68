#!/usr/bin/env bash
# The experts' gate/up rows interleaved across blocks (branch inter, on branch ahead), eleventh
# session, 2026-12-06. One call of about 6 minutes:
#   bash scripts/gpu/inter.sh [S]   read_ceiling (with the interleaved GEMV, loads only and whole);
#                                   b1 of main, ahead and inter interleaved (three rounds); inter's
#                                   whole GPU binary with the step-preset gate; b8 of main and
#                                   inter; selftest of inter
# Carry target-g/ (`carry.sh main`, `carry.sh ahead /work/ahead`, `carry.sh inter /work/inter`).
set -uo pipefail
source scripts/gpu/libs.sh
call_start inter "${1:-560}"
B=target-g
read_ceiling 60 "TB/s|bpl|GEMV's buffer"
b1_rounds 3 main ahead inter
whole_gpu inter 200
for v in main inter; do bench_step b8-$v $B/mg-$v 8; done
selftest_cuda inter 40
tar czf $OUT/inter.tgz -C /tmp $(cd /tmp && ls read_run.log gpu_*.log selftest.log b1-*.log b8-*.log ncu-*.log 2>/dev/null) \
  $(cd /tmp && ls -d b1-* b8-* 2>/dev/null | grep -v log)
echo "done in $(( $(date +%s)-STEPS_START ))s"
