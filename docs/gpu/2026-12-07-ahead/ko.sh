#!/usr/bin/env bash
# What each kernel costs inside the graph (twenty-fourth session): the b1 bench of a build of branch
# ko (main + KO_KERNELS: the kernels named there are not launched; timing only, its results
# are wrong, never landed: ko.patch) with one kernel left out at a time, interleaved with main.
#   [R=ROUNDS] bash docs/gpu/2026-12-07-ahead/ko.sh S   carry ["target-g"] with mg-main and mg-ko (R: 2)
# A kernel whose output decides control flow (the router's top-k: which experts are read) is not
# knocked out: stale ids would change what the experts read.
set -uo pipefail
source scripts/gpu/libs.sh
call_start knockout "${1:-300}"
ko_bench() { # NAME KERNELS (comma-separated, "" = none)
  step "ko-$1" 40 env KO_KERNELS="$2" target-g/mg-ko bench --backend cuda --preset step --layers 2 --graph \
    --no-torch --batch 1 --out "/tmp/ko-$1"
  local row; row=$(layer_rows "/tmp/ko-$1.log")
  # No layer row means the run did not happen (call 1's env names were refused at start): say so.
  echo "ko-$1: ${row:-NO RESULT: $(grep -m1 -iE 'error|panicked' "/tmp/ko-$1.log")}"
}
SMALL=rmsnorm_f32,add_rmsnorm_f32,fold_f32,fold_combine_residual_f32,rope_append_f32
for r in $(seq 0 $(( ${R:-2} - 1 ))); do
  bench_step "main-$r" target-g/mg-main 1
  ko_bench "none-$r" ""
  ko_bench "rmsnorm-$r" rmsnorm_f32
  ko_bench "add_rmsnorm-$r" add_rmsnorm_f32
  ko_bench "fold-$r" fold_f32
  ko_bench "fcr-$r" fold_combine_residual_f32
  ko_bench "rope-$r" rope_append_f32
  ko_bench "small-$r" "$SMALL"
  ko_bench "attention-$r" decode_attention_at_f32
  ko_bench "digest-$r" digest_batch_f32
done
pack_logs knockout.tgz 'ko-*' 'main-*'
echo "done in $(( $(date +%s)-STEPS_START ))s"
