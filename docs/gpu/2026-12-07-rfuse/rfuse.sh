#!/usr/bin/env bash
# The fused router (Op::RouterFused, twenty-third session) against main in one call of about five
# minutes (the session's last device time):
#   bash scripts/gpu/rfuse.sh [S]
# b1 of main and rfuse interleaved (R rounds, default 2), b8 of both, the whole GPU binary of rfuse
# (cuda_router:: among it; MEMRA_GPU_STEP=1), its selftest, ncu of rfuse's b1; on an H200 (issue
# 27's card) also rfuse's b1 with the PyTorch anchor. Carry target-g with mg-main, mg-rfuse and
# gpu-rfuse (`bash scripts/gpu/carry.sh main`, `bash scripts/gpu/carry.sh rfuse CHECKOUT`).
set -uo pipefail
source scripts/gpu/libs.sh
call_start rfuse "${1:-300}"
B=target-g
pass_rounds "${R:-2}" 1 main rfuse
whole_gpu rfuse 150
selftest_cuda rfuse 25
for v in main rfuse; do bench_step "b8-$v" "$B/mg-$v" 8; done
ncu_b1 ncu-b1-rfuse 25 "$B/mg-rfuse" all
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  step anchor-b1-rfuse 40 "$B/mg-rfuse" bench --backend cuda --preset step --layers 2 --graph --batch 1 \
    --out /tmp/anchor-b1-rfuse
  grep -E "fastest form|overhead|^[01] " /tmp/anchor-b1-rfuse.log | head -8
fi
pack_logs rfuse.tgz 'gpu_*.log' 'selftest*.log' 'b[18]-*' 'ncu-*.log' 'anchor-*'
echo "done in $(( $(date +%s)-STEPS_START ))s"
