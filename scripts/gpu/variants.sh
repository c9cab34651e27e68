#!/usr/bin/env bash
# The E4M3 gate/up GEMV's loads-only schedule, varied (eleventh session, 2026-12-06): what makes it
# slower than a grid-stride read of the same bytes? One short call:
#   bash scripts/gpu/variants.sh [S]   read_ceiling_bench.cu built with nvcc, run once
set -uo pipefail
source scripts/gpu/libs.sh
call_start variants "${1:-120}"
read_ceiling 30 "copy|variant|bpl|GEMV's buffer"
cp /tmp/read_run.log "$OUT/" 2>/dev/null
