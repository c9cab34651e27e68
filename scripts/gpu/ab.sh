#!/usr/bin/env bash
# Builds against a base in one call (a launch or kernel change in review):
#   [R=3] [BATCH=1] [WHOLE=NAME] bash scripts/gpu/ab.sh S BASE NEW [NEW...]
# b1 (or bBATCH: a rows kernel in review) of BASE and every NEW interleaved (R rounds); b8 of every
# build; each NEW's GPU binary on its cuda_step:: module (expert kernels against their twins, the
# step-preset device-host gate) and its selftest; ncu of every build at b1 (caches flushed) and of
# BASE with warm caches; then the whole GPU binary of WHOLE (a name among them) while time is left.
# Every step runs while its time is left (S seconds for the call).
# Carry target-g/ with mg-NAME for every build and gpu-NAME for every NEW and WHOLE
# (`bash scripts/gpu/carry.sh NAME [CHECKOUT]`). Four builds pass the 64 MiB carry limit with the
# tree: pack them (`tar cJf target-gz/g.tar.xz target-g`, about 13 MB for four), carry
# ["target-gz"] and start the command with `tar xJf target-gz/g.tar.xz &&`.
set -uo pipefail
source scripts/gpu/libs.sh
usage="usage: [R=3] [BATCH=1] [WHOLE=NAME] ab.sh S BASE NEW [NEW...]"
s=${1:?$usage}; base=${2:?$usage}; shift 2; [ $# -gt 0 ] || { echo "$usage" >&2; exit 2; }
call_start "ab-$base-$(IFS=-; echo "$*")" "$s"
B=target-g
pass_rounds "${R:-3}" "${BATCH:-1}" "$base" "$@"
for v in "$base" "$@"; do bench_step "b8-$v" "$B/mg-$v" 8; done
for v in "$@"; do
  step_module "$v"
  selftest_cuda "$v" 40; mv /tmp/selftest.log "/tmp/selftest-$v.log" 2>/dev/null
done
for v in "$base" "$@"; do ncu_b1 "ncu-b1-$v" 30 "$B/mg-$v" all; done
ncu_b1 "ncu-warm-$base" 30 "$B/mg-$base" none  # the single-row kernels as inside the graph (warm caches)
[ -n "${WHOLE:-}" ] && whole_gpu "$WHOLE" 180
pack_logs ab.tgz 'gpu_*.log' 'selftest*.log' 'b[1248]-*' 'ncu-*.log'
echo "done in $(( $(date +%s)-STEPS_START ))s"
