#!/usr/bin/env bash
# x staged with float4 loads issued together (twelfth session, 2026-12-06): gemv.cu's bpl_stage_x
# against the scalar loop it replaced. The call that ran (about 3 minutes, 176 s):
#   bash scripts/gpu/stage.sh 200   read_ceiling's staging variants; b1 of base and stage
#                                   interleaved, one round; stage's cuda_step:: module (the grouped
#                                   expert kernels against their twins, the step-preset device-host
#                                   gate); a second b1 round; selftest of stage; b8 of both
# Carry target-g/: mg-base = memra-gates of 8e0d791 (the scalar staging), mg-stage and gpu-stage
# (`carry.sh stage`). Later comparisons of builds: scripts/gpu/ab.sh.
set -uo pipefail
source scripts/gpu/libs.sh
call_start stage "${1:-200}"
B=target-g
read_ceiling 40 "copy|variant|bpl"
b1_rounds 1 base stage
step_module stage
for v in base stage; do bench_step b1-$v-1 $B/mg-$v 1; done
selftest_cuda stage 40
for v in base stage; do bench_step b8-$v $B/mg-$v 8; done
pack_logs stage.tgz read_run.log 'gpu_*.log' selftest.log 'b1-*' 'b8-*'
echo "done in $(( $(date +%s)-STEPS_START ))s"
