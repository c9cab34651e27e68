#!/usr/bin/env bash
# Weights ahead into L2 during the layer's latency-bound windows (branch pf, twenty-fourth session),
# then what each small kernel costs inside the graph (branch ko). One call:
#   bash docs/gpu/2026-12-07-ahead/pf.sh S     carry ["target-g"] with mg-main, mg-pf (7d50224+43feb19:
#   env knobs), mg-pf2 + gpu-pf2 (1582e73: the option, default on, budget L2/2), mg-ko
# pf's knobs: MEMRA_L2_AHEAD = the windows that prefetch (1: o_proj at RoPE, 2: router + shared
# expert at the o_join fold, 3: next layer's q/k/v/gate at the MoE join), MEMRA_L2_AHEAD_MB = each
# window's budget. Unset: pf prefetches nothing (its kernels take the extra parameter only).
# As run in call 1: the MEMRA_L2_AHEAD* and MEMRA_KNOCKOUT runs stopped at start (memra-gates
# refuses unknown MEMRA_* variables, README.md); the mg-pf2 runs and tests are the call's results.
set -uo pipefail
source scripts/gpu/libs.sh
call_start pf "${1:-540}"
pf_bench() { # NAME WINDOWS MB
  step "$1" 40 env MEMRA_L2_AHEAD="$2" MEMRA_L2_AHEAD_MB="$3" target-g/mg-pf bench --backend cuda --preset step \
    --layers 2 --graph --no-torch --batch 1 --out "/tmp/$1"
  echo "$1: $(grep -E '^[01] ' "/tmp/$1.log" | awk 'NF==7 {printf "L%s exp %s qkv %s; ", $1, $6, $5} NF==5 {printf "L%s ungated %s gated %s; ", $1, $2, $3}')"
}
for r in 0 1; do
  bench_step "b1-main-$r" target-g/mg-main 1
  pf_bench "pf-off-$r" "" 0
  pf_bench "pf-123-24-$r" 1,2,3 24
  pf_bench "pf-123-40-$r" 1,2,3 40
  [ "$r" = 1 ] && break
  pf_bench "pf-1-40-$r" 1 40
  pf_bench "pf-2-24-$r" 2 24
  pf_bench "pf-3-24-$r" 3 24
done
for w in "" 1,2,3; do
  step "b8-pf-$w" 40 env MEMRA_L2_AHEAD="$w" target-g/mg-pf bench --backend cuda --preset step --layers 2 --graph \
    --no-torch --batch 8 --out "/tmp/b8-pf-$w"
  echo "b8-pf-$w: $(bench_summary "/tmp/b8-pf-$w.log")"
done
for r in 0 1; do
  step "pf2-on-$r" 40 target-g/mg-pf2 bench --backend cuda --preset step --layers 2 --graph --no-torch --batch 1 --out "/tmp/pf2-on-$r"
  echo "pf2-on-$r: $(bench_summary "/tmp/pf2-on-$r.log")"
  step "pf2-off-$r" 40 target-g/mg-pf2 bench --backend cuda --preset step --layers 2 --graph --no-torch --batch 1 --no-weights-ahead --out "/tmp/pf2-off-$r"
  echo "pf2-off-$r: $(bench_summary "/tmp/pf2-off-$r.log")"
done
step_module pf2
step gpu_pf2_launch 60 target-g/gpu-pf2 --test-threads=1 cuda_launch::weights_ahead
grep -E "^test result|weights ahead into L2|panicked" -A3 /tmp/gpu_pf2_launch.log | head -8
ko_bench() { # NAME KERNELS
  step "ko-$1" 40 env MEMRA_KNOCKOUT="$2" target-g/mg-ko bench --backend cuda --preset step --layers 2 --graph \
    --no-torch --batch 1 --out "/tmp/ko-$1"
  echo "ko-$1: $(grep -E '^[01] ' "/tmp/ko-$1.log" | awk 'NF==5 {printf "L%s ungated %s gated %s; ", $1, $2, $3}')"
}
for k in rope_append_f32 decode_attention_at_f32; do
  ko_bench "$k" "$k"
done
ko_bench small rmsnorm_f32,add_rmsnorm_f32,fold_f32,fold_combine_residual_f32,rope_append_f32
pack_logs pf.tgz 'b1-*' 'b8-*' 'pf-*' 'pf2-*' 'ko-*' 'gpu_*.log'
echo "done in $(( $(date +%s)-STEPS_START ))s"
