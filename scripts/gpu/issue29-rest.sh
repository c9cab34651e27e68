#!/usr/bin/env bash
# Issue 29's EP_DEVICE_ARITHMETIC and SEL_DOWN8, and issue 27's router selection, on one H200:
# the twin tests (router, grouped expert kernels, the fused down sweep), the door modules
# (co-resident TP2/4/8 device = host oracle and census), each door's `run`, a `--matrix single`
# night on tiny and edge (every door alone), and ncu's time of the router and argmax kernels.
set -uo pipefail
source scripts/gpu/libs.sh
gpu_call issue29-rest
steps_start "${FINAL_DEADLINE:-560}"
step gpu_twins 120 $T --test-threads=1 --exact cuda_kernels::moe_kernels_match_twins
grep -E "^test |^test result" /tmp/gpu_twins.log | tail -3; grep -E "panicked" -A5 /tmp/gpu_twins.log | head -20
step gpu_grouped 120 $T --test-threads=1 grouped_expert_kernels_match_twins
grep -E "^test |^test result" /tmp/gpu_grouped.log | tail -3; grep -E "panicked" -A5 /tmp/gpu_grouped.log | head -20
step gpu_ep 180 $T --test-threads=1 cuda_ep_device29
grep -E "^test |^test result" /tmp/gpu_ep.log | tail -6; grep -E "panicked" -A5 /tmp/gpu_ep.log | head -20
step gpu_down8 150 $T --test-threads=1 cuda_down8
grep -E "^test |^test result" /tmp/gpu_down8.log | tail -5; grep -E "panicked" -A5 /tmp/gpu_down8.log | head -20
step epdev 90 $G run --backend cuda --door MEMRA_STEP_EP --door MEMRA_STEP_EP_DEVICE_ARITHMETIC --tp 2,4,8 --transport native-p2p --quiet --out /tmp/epdev
tail -2 /tmp/epdev.log
step seldown8 90 $G run --backend cuda --door MEMRA_SEL_DOWN8 --door MEMRA_STEP_NVFP4_EP2 --tp 1,2 --quiet --out /tmp/seldown8
tail -2 /tmp/seldown8.log
step single 200 $G run --matrix single --backend cuda --quiet --out /tmp/single
tail -3 /tmp/single.log; grep -h -E "VOID|FAIL|ERROR" /tmp/single.log | head -10
NCU=$(ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
step ncu 90 $NCU --clock-control none --kernel-name regex:"router_topk|argmax" --launch-count 12 --metrics gpu__time_duration.sum --csv $G bench --backend cuda --preset step --layers 1 --steps 3 --warmup 1 --no-torch --out /tmp/bench
grep -E "router_topk|argmax" /tmp/ncu.log | awk -F'","' '{print $5, $NF}' | head -14
tar czf $OUT/issue29-rest.tgz -C /tmp $(cd /tmp && ls -d *.log epdev seldown8 single 2>/dev/null) 2>/dev/null
echo "done in $(( $(date +%s)-STEPS_START ))s"
