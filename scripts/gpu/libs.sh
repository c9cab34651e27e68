#!/usr/bin/env bash
# Source me on the GPU machine: puts libcuda and libnvrtc.so.13 on LD_LIBRARY_PATH (the CUDA
# toolkit's copy, or a pip wheel's) and keeps NCCL's NVLink multicast off.
export NCCL_NVLS_ENABLE=0
for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu /usr/lib64; do
    [ -e "$d/libcuda.so.1" ] && LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
if ! ldconfig -p 2>/dev/null | grep -q 'libnvrtc\.so\.13 '; then
    f=$(find /usr/local /opt -name 'libnvrtc.so.13' 2>/dev/null | head -1)
    [ -n "$f" ] && LD_LIBRARY_PATH="$(dirname "$f"):$LD_LIBRARY_PATH"
fi
export LD_LIBRARY_PATH
# NCCL: the image's pip wheel ships libnccl.so.2 outside the loader's default path.
if ! ldconfig -p 2>/dev/null | grep -q 'libnccl\.so\.2 '; then
    f=$(find /usr/local /opt /usr/lib -name 'libnccl.so.2' 2>/dev/null | head -1)
    [ -n "$f" ] && LD_LIBRARY_PATH="$(dirname "$f"):$LD_LIBRARY_PATH"
fi
export LD_LIBRARY_PATH

# Steps under one call's deadline (device calls are short and the machine keeps nothing):
# `steps_start SECONDS`, then `step NAME NEED_S CMD...` runs CMD while NEED_S seconds are left,
# logs it to /tmp/NAME.log and prints its exit status and time; `left` prints the seconds left.
# Each step's log, and the JSON receipts of a bench written to /tmp/NAME/, are appended to
# $OUT/steps.tar as soon as the step ends: a call the device cuts short (its limit can be below the
# script's S near the end of the budget) still brings back every step it finished, where
# `pack_logs` at the script's end would never run (2026-12-07: one call lost its receipts so).
steps_start() { STEPS_START=$(date +%s); STEPS_DEADLINE=$1; }
left() { echo $(( STEPS_DEADLINE - ($(date +%s) - STEPS_START) )); }
step() {
  local name=$1 need=$2; shift 2
  if [ "$(left)" -lt "$need" ]; then echo "$name: SKIPPED ($(left)s left, needs ~${need}s)"; return; fi
  local t0=$(date +%s); timeout "$(left)" "$@" > /tmp/$name.log 2>&1; local rc=$?
  echo "$name: exit $rc in $(( $(date +%s)-t0 ))s"
  keep_step "$name"
}
keep_step() {
  [ -n "${OUT:-}" ] || return 0
  local tarf="$OUT/steps.tar" files=("$1.log")
  [ -d "/tmp/$1" ] && files+=($(cd /tmp && find "$1" -maxdepth 2 -name '*.json' -size -2M))
  # One archive, not a folder of files: at most 8 files come back from $OUT (2026-12-08: a call's
  # 149 step files were cut to 5). A step whose receipts would take it past 14 MiB (16 is the
  # limit per file) adds its log alone.
  (cd /tmp && tar -rf "$tarf" "${files[@]}") 2>/dev/null
  if [ "$(stat -c %s "$tarf" 2>/dev/null || echo 0)" -gt $((14 << 20)) ]; then
    tar -f "$tarf" --delete "${files[@]:1}" 2>/dev/null
  fi
  return 0
}

# `gpu_call NAME`: the common start of a call script — GPU tests must not skip
# (MEMRA_REQUIRE_GPU=1), all output also into $OUT/NAME.txt, T = the carried GPU test binary and
# G = the carried memra-gates (both under target-gpu/).
gpu_call() {
  export MEMRA_REQUIRE_GPU=1
  exec > >(tee -a "$OUT/$1.txt") 2>&1
  T=$(ls target-gpu/gpu-* 2>/dev/null | head -1); G=target-gpu/memra-gates
}
# `call_start NAME SECONDS`: gpu_call NAME, gpu_tools, steps_start SECONDS, then the card's name,
# memory and clock (the lent kind may be an H100 or an H200: compare only within one call).
call_start() {
  gpu_call "$1"
  gpu_tools
  steps_start "$2"
  touch /tmp/.call_start  # pack_logs keeps what this call wrote (a warm machine keeps /tmp)
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
}

# The toolkit's ncu and nvcc (empty when absent): `gpu_tools` sets NCU and NVCC.
gpu_tools() {
  NCU=$(ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
  NVCC=$(command -v nvcc || ls /usr/local/cuda*/bin/nvcc 2>/dev/null | head -1)
}
# `ncu_means CSV [REGEX]`: the mean time per launch of the layer's kernels (or those whose names
# start with REGEX) in an ncu --csv log of gpu__time_duration.sum, one line per kernel (name, unit,
# launches, mean).
ncu_means() {
  grep -E "\"(${2:-expert|gemv|router|rmsnorm|add_rmsnorm|fold|argmax})" "$1" | awk -F'","' '{k=$5; sub(/\(.*/,"",k); v=$NF; gsub(/[",]/,"",v); s[k" "$(NF-1)]+=v; n[k" "$(NF-1)]++} END {for (k in s) printf "  %-40s %4d launches  mean %9.1f\n", k, n[k], s[k]/n[k]}' | sort
}
# `nvcc_build STEP OUT SRC [NEED_S]`: the microbenchmark SRC built with nvcc under the runtime's
# NVRTC float rules (no FMA contraction, no flush to zero, IEEE division and square root) into
# /tmp/OUT, logged to /tmp/STEP.log; its last lines (`gpu_tools` first).
nvcc_build() {
  step "$1" "${4:-60}" "$NVCC" -O3 -std=c++17 -arch=sm_90 --fmad=false -ftz=false -prec-div=true -prec-sqrt=true \
    -I kernels/cuda -o "/tmp/$2" "$3"
  tail -5 "/tmp/$1.log"
}
# `experts_fuse_probe`: scripts/gpu/experts_fuse_bench.cu (the experts seam as one launch, against
# the shipped split launches; docs/gpu/2026-12-07-fuse/) built with nvcc and run into
# /tmp/fuse_bench.log, printed whole (bits first, then µs per layer per form; `gpu_tools` first).
experts_fuse_probe() {
  nvcc_build fuse_build experts_fuse scripts/gpu/experts_fuse_bench.cu 60
  step fuse_bench 40 /tmp/experts_fuse
  cat /tmp/fuse_bench.log
}
# `read_ceiling NEED_S PATTERN`: scripts/gpu/read_ceiling_bench.cu built with nvcc and run once into
# /tmp/read_run.log; prints its lines matching PATTERN (`gpu_tools` first).
read_ceiling() {
  nvcc_build read_build read_ceiling scripts/gpu/read_ceiling_bench.cu
  step read_run "$1" /tmp/read_ceiling; grep -E "$2" /tmp/read_run.log
}
# `build_fma_bench`: the FMA lane-order microbenchmark (e4m3_fma_bench.cu) into /tmp/e4m3_fma.
build_fma_bench() { nvcc_build fma_build e4m3_fma scripts/gpu/e4m3_fma_bench.cu; }
# `gpu_modules FILTER...`: the carried GPU test binary ($T) on each filter, one test thread, logged to
# /tmp/gpu_<filter>.log; prints its result line and the first panics.
gpu_modules() {
  local m n
  for m in "$@"; do
    n=gpu_${m//:/}; step "$n" 60 "$T" --test-threads=1 "$m"
    grep -E "^test result" "/tmp/$n.log"; grep -E "panicked" -A6 "/tmp/$n.log" | head -14
  done
}
# `bench_b1_b8 [PATTERN]`: bench of the step layer (2 layers, --graph, no torch) with $G at --batch 1
# and 8 into /tmp/bench1 and /tmp/bench8; prints the log lines matching PATTERN.
bench_b1_b8() {
  local pat="${1:-^[01] |L0: .*per token|overhead}" b
  for b in 1 8; do
    step "bench$b" 40 "$G" bench --backend cuda --preset step --layers 2 --graph --no-torch --batch "$b" --out "/tmp/bench$b"
    grep -E "$pat" "/tmp/bench$b.log" | head -10
  done
}
# `ncu_b1 NAME NEED_S [BIN] [CACHE]`: ncu's per-kernel time of one b1 bench of BIN ($G) into
# /tmp/NAME.log and $OUT/NAME.csv, then the means per kernel (nothing without ncu; `gpu_tools`
# first). CACHE is ncu's --cache-control: `all` (the default: caches flushed before each kernel) or
# `none` (warm, as inside a graph replay). ncu's default clock control locks the GPU's clocks to
# base while it profiles; the lent machine's rules say to leave the clocks alone (the device tool's
# method notes), so it runs with `--clock-control none` and its times are at the clocks the card
# runs (the logs before this line was added are at base clocks).
ncu_b1() { ncu_bench "$1" "$2" "${3:-$G}" "${4:-all}" 1 200 80; }
# `targets_b1 BIN BENCH_DIR [NCU_LOG]`: issue 27's target table (`bench --targets`) from the b1
# receipt a bench_shape step wrote into BENCH_DIR and, where it exists, ncu_b1's log of the same
# build; printed whole (the rows, the anchor, ncu per kernel, the verdict).
targets_b1() {
  local r; r=$(ls "$2"/run-*.json 2>/dev/null | head -1)
  [ -n "$r" ] || { echo "targets: no receipt in $2"; return; }
  local ncu=(); [ -f "${3:-}" ] && ncu=(--ncu "$3")
  step targets 10 "$1" bench --targets "$r" ${ncu[@]+"${ncu[@]}"}
  cat /tmp/targets.log
}
# `ncu_bench NAME NEED_S BIN CACHE BATCH SKIP COUNT [REGEX]`: the common body — COUNT launches of
# BIN's bench at B = BATCH after SKIP, CSV into $OUT, the means per kernel (ncu_means REGEX).
ncu_bench() {
  local name=$1 need=$2 bin=$3 cache=$4 batch=$5 skip=$6 count=$7
  [ -n "$NCU" ] || { echo "$name: no ncu on this machine"; return; }
  step "$name" "$need" "$NCU" --clock-control none --cache-control "$cache" --metrics gpu__time_duration.sum --csv \
    --launch-skip "$skip" --launch-count "$count" "$bin" bench --backend cuda --preset step --layers 2 \
    --batch "$batch" --no-torch --out "/tmp/$name-bench"
  cp "/tmp/$name.log" "$OUT/$name.csv"
  ncu_means "/tmp/$name.log" ${8:+"$8"}
}
# `ncu_pass NAME BATCH BIN`: ncu of about two passes of BIN's bench at B = BATCH (the default
# program: a b8 pass is about 70 launches per layer; the warm-up skipped), CSV into $OUT, the mean
# per kernel of every kernel.
ncu_pass() { ncu_bench "$1" 60 "$3" all "$2" 400 300 "[a-z]"; }
# `b1_rounds N V...`: the b1 bench (bench_step) of target-g/mg-V for every V, interleaved, N rounds
# (b1-V-ROUND): builds compared within one call. `pass_rounds N B V...`: the same at B rows per pass
# (bB-V-ROUND).
b1_rounds() { pass_rounds "$1" 1 "${@:2}"; }
pass_rounds() {
  local n=$1 b=$2 r v; shift 2
  for ((r = 0; r < n; r++)); do
    for v in "$@"; do bench_step "b$b-$v-$r" "target-g/mg-$v" "$b"; done
  done
}
# `step_module NAME [NEED_S]`: target-g/gpu-NAME's cuda_step:: module (the grouped expert kernels
# against their twins, the step-preset device-host gate), one thread, into /tmp/gpu_NAME_step.log
# (skipped with less than NEED_S, default 60, left); its result lines and first panics.
step_module() {
  step "gpu_$1_step" "${2:-60}" env MEMRA_GPU_STEP=1 "target-g/gpu-$1" --test-threads=1 cuda_step::
  grep -E "^test result|step preset device-host|panicked" "/tmp/gpu_$1_step.log" | head -6
}
# `pack_logs ARCHIVE GLOB...`: the files and folders of /tmp matching a GLOB that this call wrote
# (newer than call_start's mark: a machine kept warm between calls keeps the earlier calls' logs in
# /tmp, which must not land in this call's archive) into $OUT/ARCHIVE.
pack_logs() {
  local archive=$1 f keep=(); shift
  for f in $(cd /tmp && ls -d $@ 2>/dev/null); do [ "/tmp/$f" -nt /tmp/.call_start ] && keep+=("$f"); done
  [ ${#keep[@]} -gt 0 ] && tar czf "$OUT/$archive" -C /tmp "${keep[@]}"
}
# `whole_gpu NAME NEED_S`: every test of target-g/gpu-NAME with the step-preset gate
# (MEMRA_GPU_STEP=1), one thread, into /tmp/gpu_NAME.log; its result lines and first panics.
whole_gpu() {
  step "gpu_$1" "$2" env MEMRA_GPU_STEP=1 "target-g/gpu-$1" --test-threads=1
  grep -E "^test result|step preset device-host|shared slot ahead|panicked" "/tmp/gpu_$1.log" | head -8
}
# `selftest_cuda NAME NEED_S`: `selftest --backend cuda` of target-g/mg-NAME into /tmp/selftest; its
# verdict, and its summary into $OUT.
selftest_cuda() {
  step selftest "$2" "target-g/mg-$1" selftest --backend cuda --out /tmp/selftest
  grep -E "canary was caught|NOT CAUGHT|MISSED" /tmp/selftest.log | head -3
  cp /tmp/selftest/summary.md "$OUT/selftest-cuda-summary.md" 2>/dev/null
}
# `bench_step NAME BIN BATCH [FLAG]`: one bench of the step layer (2 layers, --graph, no torch) with
# BIN at --batch BATCH (and FLAG, e.g. --serialized-launches) into /tmp/NAME, then its
# `bench_summary` line.
bench_step() {
  step "$1" 40 "$2" bench --backend cuda --preset step --layers 2 --graph --no-torch --batch "$3" ${4:-} --out "/tmp/$1"
  echo "$1: $(bench_summary "/tmp/$1.log")"
}
# `row_floor`: scripts/gpu/row_floor_bench.cu built with nvcc, event-timed, then under ncu with and
# without its cache flush (CSVs into $OUT), the mean per kernel (`gpu_tools` first).
row_floor() {
  nvcc_build floor_build row_floor scripts/gpu/row_floor_bench.cu 40
  step floor_run 20 /tmp/row_floor; cat /tmp/floor_run.log
  for cc in all none; do
    # 25 launches per kernel and round, two rounds: the first 10 of each kernel are left out.
    step floor_ncu_$cc 30 "$NCU" --clock-control none --cache-control $cc --metrics gpu__time_duration.sum --csv \
      /tmp/row_floor 25
    cp /tmp/floor_ncu_$cc.log "$OUT/floor-ncu-$cc.csv"
    echo "row floor, ncu cache-control $cc:"
    grep -E '"(empty|copy_row|norm_shape)' /tmp/floor_ncu_$cc.log | awk -F'","' '{k=$5; sub(/\(.*/,"",k); v=$NF; gsub(/[",]/,"",v); c[k]++; if (c[k] > 10) {s[k]+=v; n[k]++}} END {for (k in s) printf "  %-12s %3d launches  mean %7.1f ns\n", k, n[k], s[k]/n[k]}'
  done
}
# `layer_rows LOG`: one line from a bench log of `--layers 2`: each layer's ungated and gated
# latency (µs); empty where the run wrote no layer row.
layer_rows() {
  grep -E '^[01] ' "$1" | awk 'NF==5 {printf "L%s ungated %s gated %s; ", $1, $2, $3}'
}
# `seam_table PREFIX`: per seam (µs, medians of the seam-timed run, layer 0 / layer 1) of every
# bench receipt under /tmp/PREFIX*/: the weights-ahead carriers (rope, o_join, moe_join) and the
# streams they prefetch for (o_proj, experts, qkv); NO RESULT for a run that wrote no receipt, "-"
# for a seam its receipt lacks.
seam_table() {
  python3 - "$1" <<'PY'
import glob, json, os, sys
for d in sorted(glob.glob('/tmp/' + sys.argv[1] + '*/')):
    f = glob.glob(d + 'run-*.json')
    if not f:
        print(os.path.basename(d.rstrip('/')).ljust(16), 'NO RESULT (no receipt: see its log)')
        continue
    lat = {(x['layer'], x['seam']): x['median_ns'] / 1000 for x in json.load(open(f[0]))['measurements']['latency']}
    cols = ['rope', 'o_proj', 'o_join', 'experts', 'moe_join', 'qkv']
    # A seam the receipt lacks prints as "-", never as a 0 µs seam.
    v = lambda k: f"{lat[k]:.1f}" if k in lat else '-'
    print(os.path.basename(d.rstrip('/')).ljust(16), ' '.join(f"{c} {v((0, c))}/{v((1, c))}" for c in cols))
PY
}
# `bench_summary LOG`: one line from a bench log of `--layers 2`: per layer the experts and qkv seams
# (µs / floor µs), then each layer's gated latency.
bench_summary() {
  grep -E '^[01] ' "$1" | awk 'NF==7 {printf "L%s exp %s qkv %s; ", $1, $6, $5} NF==5 {printf "L%s gated %s; ", $1, $3}'
}
# `mps_start`: an MPS control daemon of this call's own (pipe and log folders under /tmp, exported
# for the CUDA clients started after it), stopped by `mps_stop` or when the script exits; returns
# non-zero (saying why) where there is none. MPS changes no setting of the GPU (not its compute
# mode, clocks, power or MIG): it is a user process the CUDA clients connect to.
mps_start() {
  MPS=$(command -v nvidia-cuda-mps-control || ls /usr/bin/nvidia-cuda-mps-control /usr/local/nvidia/bin/nvidia-cuda-mps-control 2>/dev/null | head -1)
  [ -n "$MPS" ] || { echo "no nvidia-cuda-mps-control on this machine"; return 1; }
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  trap 'echo quit | "$MPS" 2>/dev/null' EXIT
  "$MPS" -d || { echo "nvidia-cuda-mps-control -d failed"; return 1; }
  sleep 1
}
# `mps_stop`: quit the daemon of `mps_start`, and clients started after this run without it.
mps_stop() {
  echo quit | "$MPS"; sleep 2
  tail -3 "$CUDA_MPS_LOG_DIRECTORY/control.log" 2>/dev/null
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
}
