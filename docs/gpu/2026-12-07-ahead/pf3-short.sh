#!/usr/bin/env bash
# pf3.sh cut to what the device time left allows (twenty-fourth session, last call): pf3b with and
# without weights ahead, pf3a with, interleaved; the per-seam table; the no-bit test of pf3b.
#   bash docs/gpu/2026-12-07-ahead/pf3-short.sh S     carry ["target-g"] with mg-pf3a, mg-pf3b, gpu-pf3b
set -uo pipefail
source scripts/gpu/libs.sh
call_start pf3s "${1:-120}"
bench_step "b1-pf3b-on-0" target-g/mg-pf3b 1
bench_step "b1-pf3b-off-0" target-g/mg-pf3b 1 --no-weights-ahead
bench_step "b1-pf3a-on-0" target-g/mg-pf3a 1
bench_step "b1-pf3b-on-1" target-g/mg-pf3b 1
bench_step "b1-pf3b-off-1" target-g/mg-pf3b 1 --no-weights-ahead
# Per seam (µs, medians, layer 0 / layer 1) of every run above: the carriers (rope, o_join,
# moe_join) and the streams they prefetch for (o_proj, experts, qkv).
python3 - <<'PY'
import glob, json, os
for d in sorted(glob.glob('/tmp/b1-*/')):
    f = glob.glob(d + 'run-*.json')
    if not f:
        continue
    lat = {(x['layer'], x['seam']): x['median_ns'] / 1000 for x in json.load(open(f[0]))['measurements']['latency']}
    cols = ['rope', 'o_proj', 'o_join', 'experts', 'moe_join', 'qkv']
    print(os.path.basename(d.rstrip('/')).ljust(16), ' '.join(f"{c} {lat.get((0, c), 0):.1f}/{lat.get((1, c), 0):.1f}" for c in cols))
PY
step gpu_pf3b_launch 15 target-g/gpu-pf3b --test-threads=1 cuda_launch::weights_ahead
grep -E "^test result|weights ahead into L2|panicked" -A3 /tmp/gpu_pf3b_launch.log | head -6
pack_logs pf3s.tgz 'b1-*' 'gpu_*.log'
echo "done in $(( $(date +%s)-STEPS_START ))s"
