#!/usr/bin/env bash
# x staged with float4 loads issued together (twelfth session, 2026-12-06): gemv.cu's bpl_stage_x
# against the scalar loop it replaced. One call of 5 to 8 minutes, each step while time is left:
#   bash scripts/gpu/stage.sh [S [R]]   read_ceiling's staging variants; b1 of base and stage
#                                       interleaved (R rounds, default 3); stage's whole GPU binary
#                                       with the step-preset gate; selftest of stage; b8 of both;
#                                       ncu of both at b1
#   bash scripts/gpu/stage.sh S 0 short   (a short call: one b1 round, the GPU binary's cuda_step::
#                                         module with the step-preset gate, a second b1 round)
# Carry target-g/: mg-base = memra-gates of 8e0d791 (the scalar staging), mg-stage and gpu-stage
# (`carry.sh stage`). The staging lands if stage's b1 layer beats base's in every round and its
# whole GPU binary passes.
set -uo pipefail
source scripts/gpu/libs.sh
call_start stage "${1:-540}"
B=target-g
read_ceiling 40 "copy|variant|bpl"
if [ "${3:-}" = short ]; then  # a call of about 3 minutes: one round, the step module, one more round
  b1_rounds 1 base stage
  step gpu_stage_step 60 env MEMRA_GPU_STEP=1 $B/gpu-stage --test-threads=1 cuda_step::
  grep -E "^test result|step preset device-host|panicked" /tmp/gpu_stage_step.log | head -6
  for v in base stage; do bench_step b1-$v-1 $B/mg-$v 1; done
fi
b1_rounds "${2:-3}" base stage
whole_gpu stage 180
selftest_cuda stage 40
for v in base stage; do bench_step b8-$v $B/mg-$v 8; done
for v in base stage; do ncu_b1 ncu-b1-$v 30 $B/mg-$v all; done
tar czf $OUT/stage.tgz -C /tmp $(cd /tmp && ls read_run.log gpu_*.log selftest.log b1-*.log b8-*.log ncu-*.log 2>/dev/null) \
  $(cd /tmp && ls -d b1-* b8-* 2>/dev/null | grep -v log)
echo "done in $(( $(date +%s)-STEPS_START ))s"
