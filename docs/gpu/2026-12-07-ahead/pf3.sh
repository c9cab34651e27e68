#!/usr/bin/env bash
# Weights ahead by per-thread `prefetch.global.L2` (twenty-fourth session, second call): the bulk
# prefetch of the first call held its kernel until the bytes arrived (RoPE, o_join, moe_join each
# +6.5-8.5 us). pf3a issues the prefetches right after the wait, pf3b after the kernel's own work.
#   bash docs/gpu/2026-12-07-ahead/pf3.sh S     carry ["target-g"] with mg-main, mg-pf3a, mg-pf3b, gpu-pf3b
set -uo pipefail
source scripts/gpu/libs.sh
call_start pf3 "${1:-300}"
bench_step "b1-main-0" target-g/mg-main 1
for r in 0 1; do
  for v in pf3b pf3a; do
    bench_step "b1-$v-on-$r" "target-g/mg-$v" 1
    [ "$r" = 1 ] && [ "$v" = pf3a ] && continue
    bench_step "b1-$v-off-$r" "target-g/mg-$v" 1 --no-weights-ahead
  done
done
# Per seam (µs, medians, layer 0 / layer 1) of every run above: the carriers (rope, o_join,
# moe_join) and the streams they prefetch for (o_proj, experts, qkv).
python3 - <<'PY'
import glob, json, os
for d in sorted(glob.glob('/tmp/b1-*/')):
    f = glob.glob(d + 'run-*.json')
    if not f:
        print(os.path.basename(d.rstrip('/')).ljust(16), 'NO RESULT (no receipt: see its log)')
        continue
    lat = {(x['layer'], x['seam']): x['median_ns'] / 1000 for x in json.load(open(f[0]))['measurements']['latency']}
    cols = ['rope', 'o_proj', 'o_join', 'experts', 'moe_join', 'qkv']
    print(os.path.basename(d.rstrip('/')).ljust(16), ' '.join(f"{c} {lat.get((0, c), 0):.1f}/{lat.get((1, c), 0):.1f}" for c in cols))
PY
step gpu_pf3b_launch 30 target-g/gpu-pf3b --test-threads=1 cuda_launch::weights_ahead
grep -E "^test result|weights ahead into L2|panicked" -A3 /tmp/gpu_pf3b_launch.log | head -6

pack_logs pf3.tgz 'b1-*' 'gpu_*.log'
echo "done in $(( $(date +%s)-STEPS_START ))s"
