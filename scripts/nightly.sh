#!/usr/bin/env bash
# One night of memra-gates, end to end (docs/DESIGN.md §8, issue 13): build, `run --matrix all`
# sharded over the runner's GPUs (or host processes), the `step` decode shape, `selftest` and
# `bench` on the device, `diff` against the previous night, `plot --history` and `promote
# --history` over the last nights. Everything lands in ONE folder, NIGHTS/NAME:
#
#   matrix/         the matrix's receipts of `tiny` (shards merged by hard links), matrix/edge/ of `edge`
#   shards/I/       each shard's own run outputs (summary.json, summary.md, junit.xml, latency.csv)
#   step/           the step-shape receipts          selftest/  the canaries' receipts and summary
#   bench/          the performance receipt          diff/      <set>.md against the previous night
#   plots/<set>/    plot --history (one screen) and  promote/   <set>.txt tables, <set>.toml blocks
#                   plot --doors (door-effects.*)    effects/   <set>.md: door effects, cost of exactness
#   logs/           every step's output              report.md  verdicts, regressions, promotable
#                                                               doors, phase times, step statuses
#
# Every step runs even when an earlier one failed (except after a failed build), the report says
# which failed, and the script exits 1 when any did (2 for a usage error). A night that finds a
# FAIL, an ERROR or a latency regression beyond diff's threshold fails: that is the point of it.
#
# Options (flag, or the environment variable beside it):
#   --backend cuda|host   NIGHTLY_BACKEND   default cuda
#   --matrix M            NIGHTLY_MATRIX    the door matrix (default all; any `run --matrix` value)
#   --shards N            NIGHTLY_SHARDS    the matrix split into N concurrent processes. CUDA:
#                                           default the number of GPUs; shard I sees GPUs
#                                           I*G..I*G+G-1 (G = GPUs / N), and a TP above G runs
#                                           co-resident on its shard's first GPU (set --shards 1 to
#                                           give TP8 eight distinct GPUs). Host: default 1 (one
#                                           process already uses every core); N > 1 splits the
#                                           cores (--jobs cores/N, ranks inline).
#   --shard I/N           NIGHTLY_SHARD     run only shard I of N of the matrix (a partial night,
#                                           e.g. CI's smoke, or one runner of several)
#   --bin PATH            NIGHTLY_BIN       a memra-gates binary (default: cargo build --release)
#   --nights DIR          NIGHTLY_DIR       where nights live (default: nights)
#   --name NAME           NIGHTLY_NAME      this night's folder (default: UTC date-time; names sort
#                                           in time order, the previous night is the last before it)
#   --history K           NIGHTLY_HISTORY   nights (this one included) for plot/promote (default 7)
#   --promote-nights N    NIGHTLY_PROMOTE_NIGHTS  promote --nights (default: promote's, 7)
#   --diff-threshold X    NIGHTLY_DIFF_THRESHOLD  diff --threshold (default: diff's: 0.5 host,
#                                           0.1 CUDA); verdict flips count whatever the threshold
#   --step-args "…"       NIGHTLY_STEP_ARGS    arguments of the step run, or `skip` (default
#                                           --preset step --layers 4 --prompts 2 --gen-tokens 8)
#   --selftest-args "…"   NIGHTLY_SELFTEST_ARGS  extra selftest arguments, or `skip`
#   --bench-args "…"      NIGHTLY_BENCH_ARGS   bench arguments, or `skip` (default CUDA: --preset
#                                           step --layers 2; host: --allow-host --no-torch
#                                           --steps 4 --warmup 1)
#   --matrix-args "…"     NIGHTLY_MATRIX_ARGS  extra arguments of every matrix shard; on a runner
#                                           with CUDA MPS running, "--worker-processes 8" splits
#                                           each GPU's shard over 8 processes (docs/gpu/README.md,
#                                           "A night on one GPU")
# A skipped step is reported as skipped, with the option that skipped it.
set -euo pipefail
export LC_ALL=C # night names compare and sort bytewise
cd "$(dirname "$0")/.."
root=$(pwd)

usage() {
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
    exit 2
}
backend="${NIGHTLY_BACKEND:-cuda}"
matrix="${NIGHTLY_MATRIX:-all}"
shards="${NIGHTLY_SHARDS:-}"
only_shard="${NIGHTLY_SHARD:-}"
bin="${NIGHTLY_BIN:-}"
nights="${NIGHTLY_DIR:-nights}"
name="${NIGHTLY_NAME:-$(date -u +%Y-%m-%dT%H%M%SZ)}"
history="${NIGHTLY_HISTORY:-7}"
promote_nights="${NIGHTLY_PROMOTE_NIGHTS:-}"
diff_threshold="${NIGHTLY_DIFF_THRESHOLD:-}"
step_args="${NIGHTLY_STEP_ARGS:---preset step --layers 4 --prompts 2 --gen-tokens 8}"
selftest_args="${NIGHTLY_SELFTEST_ARGS:-}"
bench_args="${NIGHTLY_BENCH_ARGS:-}"
matrix_args="${NIGHTLY_MATRIX_ARGS:-}"
while [ $# -gt 0 ]; do
    case "$1" in -h | --help) usage ;; esac
    [ $# -ge 2 ] || { echo "nightly.sh: $1 needs a value" >&2; exit 2; }
    case "$1" in
        --backend) backend="$2" ;;
        --matrix) matrix="$2" ;;
        --shards) shards="$2" ;;
        --shard) only_shard="$2" ;;
        --bin) bin="$2" ;;
        --nights) nights="$2" ;;
        --name) name="$2" ;;
        --history) history="$2" ;;
        --promote-nights) promote_nights="$2" ;;
        --diff-threshold) diff_threshold="$2" ;;
        --step-args) step_args="$2" ;;
        --selftest-args) selftest_args="$2" ;;
        --bench-args) bench_args="$2" ;;
        --matrix-args) matrix_args="$2" ;;
        *) echo "nightly.sh: unknown option \`$1\` (--help lists them)" >&2; exit 2 ;;
    esac
    shift 2
done
case "$backend" in
    cuda | host) ;;
    *) echo "nightly.sh: --backend \`$backend\`: use cuda or host" >&2; exit 2 ;;
esac
[[ "$history" =~ ^[1-9][0-9]*$ ]] || { echo "nightly.sh: --history \`$history\`: a count of nights ≥ 1" >&2; exit 2; }
command -v python3 >/dev/null || { echo "nightly.sh: python3 is required for the report" >&2; exit 2; }
if [ "$backend" = cuda ]; then
    export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"
    # shellcheck source=scripts/gpu/libs.sh
    source scripts/gpu/libs.sh
    export MEMRA_REQUIRE_GPU=1
    gpus=()
    if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
        IFS=, read -r -a gpus <<<"$CUDA_VISIBLE_DEVICES"
    elif command -v nvidia-smi >/dev/null; then
        mapfile -t gpus < <(nvidia-smi --query-gpu=index --format=csv,noheader)
    fi
    [ "${#gpus[@]}" -gt 0 ] || { echo "nightly.sh: --backend cuda, but no GPU is listed (nvidia-smi, CUDA_VISIBLE_DEVICES)" >&2; exit 2; }
    # One shard per GPU, unless one shard of the matrix is asked for (it sees every GPU).
    [ -n "$only_shard" ] && shards="${shards:-1}"
    shards="${shards:-${#gpus[@]}}"
    [ -n "$bench_args" ] || bench_args="--preset step --layers 2"
else
    shards="${shards:-1}"
    [ -n "$bench_args" ] || bench_args="--allow-host --no-torch --steps 4 --warmup 1"
fi
[[ "$shards" =~ ^[1-9][0-9]*$ ]] || { echo "nightly.sh: --shards \`$shards\`: a count ≥ 1" >&2; exit 2; }
if [ "$backend" = cuda ] && [ "$shards" -gt "${#gpus[@]}" ]; then
    echo "nightly.sh: --shards $shards: only ${#gpus[@]} GPU(s) (${gpus[*]})" >&2
    exit 2
fi
if [ -n "$only_shard" ]; then
    [[ "$only_shard" =~ ^[0-9]+/[1-9][0-9]*$ ]] || { echo "nightly.sh: --shard \`$only_shard\`: I/N, e.g. 0/64" >&2; exit 2; }
    [ "$shards" -eq 1 ] || { echo "nightly.sh: --shard runs one shard: give --shards 1 with it" >&2; exit 2; }
fi

night="$nights/$name"
if [ -e "$night" ]; then
    echo "nightly.sh: $night exists: a night's folder is never reused (--name gives another)" >&2
    exit 2
fi
mkdir -p "$night/logs"
night=$(cd "$night" && pwd)
nights=$(dirname "$night")
steps="$night/logs/steps.tsv"
printf 'step\tstatus\tseconds\tcommand\n' >"$steps"
failed=0

# The report is written however the script ends (a failed step, or the script itself dying).
write_report() {
    local rc=$?
    trap - EXIT
    local prev_arg=()
    [ -n "${prev:-}" ] && prev_arg=(--previous "$prev")
    if ! python3 "$root/scripts/nightly_report.py" "$night" --backend "$backend" --matrix "$matrix" --shards "$shards" \
        ${only_shard:+--shard "$only_shard"} "${prev_arg[@]}" --history "${history_dirs_file:-}" >"$night/report.md"; then
        echo "nightly.sh: the report could not be written ($night/report.md)" >&2
        rc=1
    fi
    if [ "$rc" -eq 0 ] && [ "$failed" -ne 0 ]; then rc=1; fi
    echo "nightly.sh: night $name: $( [ "$rc" -eq 0 ] && echo passed || echo FAILED ) → $night/report.md" >&2
    exit "$rc"
}
trap write_report EXIT

# step NAME COMMAND…: run it with its output in logs/NAME.log, record status and seconds.
step() {
    local sname="$1" t0 rc
    shift
    t0=$(date +%s.%N)
    echo "== $sname: $*" >&2
    if "$@" >"$night/logs/$sname.log" 2>&1; then rc=0; else rc=$?; fi
    local secs
    secs=$(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$t0" "$(date +%s.%N)")
    if [ "$rc" -eq 0 ]; then
        printf '%s\tok\t%s\t%s\n' "$sname" "$secs" "$*" >>"$steps"
    else
        printf '%s\tFAILED (exit %s)\t%s\t%s\n' "$sname" "$rc" "$secs" "$*" >>"$steps"
        echo "!! $sname failed (exit $rc): $night/logs/$sname.log" >&2
        tail -20 "$night/logs/$sname.log" >&2 || true
        failed=1
    fi
    return 0
}
skipped() { # NAME WHY
    printf '%s\tskipped: %s\t0\t-\n' "$1" "$2" >>"$steps"
    echo "-- $1 skipped: $2" >&2
}

# 1. Build (or take the given binary).
if [ -z "$bin" ]; then
    step build cargo build --release
    bin="$root/target/release/memra-gates"
fi
if [ ! -x "$bin" ]; then
    skipped everything-else "no memra-gates binary at $bin"
    failed=1
    exit 1
fi
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
"$bin" --version >"$night/version.txt" 2>&1 || true

# 2. The matrix (all by default), sharded. Shard I writes shards/I (tiny) and shards/I/edge; the
#    receipts are then linked into matrix/ and matrix/edge/, one directory per model as diff, plot
#    and promote read them.
read -r -a mx_extra <<<"$matrix_args"
run_shard() { # I N DIR [devices]
    local i="$1" n="$2" dir="$3" devs="${4:-}" jobs=()
    if [ "$backend" = host ] && [ "$n" -gt 1 ]; then
        local cores
        cores=$(nproc)
        # The N processes fill the cores together: each job's ranks run inline (the same bits;
        # `--host-ranks auto` only sees its own process's jobs).
        jobs=(--jobs "$(( cores / n > 0 ? cores / n : 1 ))" --host-ranks inline)
    fi
    if [ -n "$devs" ]; then
        CUDA_VISIBLE_DEVICES="$devs" "$bin" run --matrix "$matrix" --backend "$backend" --shard "$i/$n" "${jobs[@]}" \
            --out "$dir" "${mx_extra[@]}"
    else
        "$bin" run --matrix "$matrix" --backend "$backend" --shard "$i/$n" "${jobs[@]}" --out "$dir" "${mx_extra[@]}"
    fi
}
link_receipts() { # FROM TO: hard links (a copy across file systems) of FROM's receipts in TO
    mkdir -p "$2"
    local f
    for f in "$1"/run-*.json; do
        [ -e "$f" ] || continue
        ln -f "$f" "$2/" 2>/dev/null || cp -f "$f" "$2/" || { echo "could not place $f in $2"; return 1; }
    done
}
matrix_all() {
    local pids=() rc=0 i
    if [ -n "$only_shard" ]; then
        run_shard "${only_shard%/*}" "${only_shard#*/}" "$night/shards/${only_shard%/*}" || rc=$?
    else
        local per=1
        [ "$backend" = cuda ] && per=$(( ${#gpus[@]} / shards ))
        for ((i = 0; i < shards; i++)); do
            local devs=""
            if [ "$backend" = cuda ]; then
                devs=$(IFS=,; echo "${gpus[*]:$(( i * per )):$per}")
            fi
            run_shard "$i" "$shards" "$night/shards/$i" "$devs" >"$night/logs/matrix-shard$i.log" 2>&1 &
            pids+=("$!")
        done
        for i in "${!pids[@]}"; do
            local code=0
            wait "${pids[$i]}" || code=$?
            if [ "$code" -ne 0 ]; then
                echo "shard $i/$shards failed (exit $code): logs/matrix-shard$i.log"
                tail -5 "$night/logs/matrix-shard$i.log"
                [ "$code" -gt "$rc" ] && rc=$code
            fi
        done
    fi
    # Merge: every shard's receipts of each model into one directory per model.
    mkdir -p "$night/matrix"
    local d
    for d in "$night"/shards/*/; do
        [ -d "$d" ] || continue
        link_receipts "$d" "$night/matrix" || rc=2
        local sub
        for sub in "$d"*/; do
            [ -d "$sub" ] || continue
            link_receipts "$sub" "$night/matrix/$(basename "$sub")" || rc=2
        done
    done
    return "$rc"
}
step matrix matrix_all

# 3. The step shape: the engine's real decode shape, every TP size and transport.
if [ "$step_args" = skip ]; then
    skipped step "NIGHTLY_STEP_ARGS=skip"
else
    read -r -a st <<<"$step_args"
    step step "$bin" run --backend "$backend" "${st[@]}" --out "$night/step"
fi

# 4. selftest and bench on the device.
if [ "$selftest_args" = skip ]; then
    skipped selftest "NIGHTLY_SELFTEST_ARGS=skip"
else
    read -r -a sa <<<"$selftest_args"
    step selftest "$bin" selftest --backend "$backend" "${sa[@]}" --out "$night/selftest"
fi
if [ "$bench_args" = skip ]; then
    skipped bench "NIGHTLY_BENCH_ARGS=skip"
else
    read -r -a ba <<<"$bench_args"
    step bench "$bin" bench --backend "$backend" "${ba[@]}" --out "$night/bench"
fi

# 5. The earlier nights: folders of $nights sorted by name before this one, holding receipts.
earlier=()
while IFS= read -r d; do
    [ "$d" = "$name" ] && continue
    [[ "$d" < "$name" ]] || continue
    compgen -G "$nights/$d/matrix/run-*.json" >/dev/null && earlier+=("$nights/$d")
done < <(ls -1 "$nights" | sort)
prev=""
[ "${#earlier[@]}" -gt 0 ] && prev="${earlier[-1]}"
from=$(( ${#earlier[@]} - (history - 1) ))
[ "$from" -ge 0 ] || from=0
window=("${earlier[@]:$from}" "$night")
history_dirs_file="$night/logs/history.txt"
printf '%s\n' "${window[@]}" >"$history_dirs_file"

# The receipt sets a night compares: tiny (matrix/), each further model of the default set
# (matrix/<preset>/) and the step run (step/).
sets=()
[ -d "$night/matrix" ] && sets+=(matrix)
for d in "$night"/matrix/*/; do [ -d "$d" ] && sets+=("matrix/$(basename "$d")"); done
[ -d "$night/step" ] && sets+=(step)
setname() { echo "${1//\//-}"; }
has_receipts() { compgen -G "$1/run-*.json" >/dev/null; }

# 6. diff against the previous night, set by set.
mkdir -p "$night/diff"
if [ -z "$prev" ]; then
    skipped diff "no earlier night in $nights"
else
    thr=()
    [ -n "$diff_threshold" ] && thr=(--threshold "$diff_threshold")
    for s in "${sets[@]}"; do
        if has_receipts "$prev/$s" && has_receipts "$night/$s"; then
            step "diff-$(setname "$s")" sh -c '"$@" >"$0"' "$night/diff/$(setname "$s").md" \
                "$bin" diff "$prev/$s" "$night/$s" --format md "${thr[@]}"
        else
            skipped "diff-$(setname "$s")" "$s has no receipts in $(basename "$prev") or in this night"
        fi
    done
fi

# 7. plot --history, effects, plot --doors and promote --history over the window, set by set (one
#    model per set).
pn=()
[ -n "$promote_nights" ] && pn=(--nights "$promote_nights")
mkdir -p "$night/plots" "$night/promote" "$night/effects"
for s in "${sets[@]}"; do
    dirs=()
    for w in "${window[@]}"; do has_receipts "$w/$s" && dirs+=("$w/$s"); done
    if [ "${#dirs[@]}" -eq 0 ]; then
        skipped "plot-$(setname "$s")" "no receipts of $s"
        continue
    fi
    step "plot-$(setname "$s")" "$bin" plot --history "${dirs[@]}" --out "$night/plots/$(setname "$s")"
    if [ "$s" = step ]; then
        continue # the step run has no door matrix to promote from
    fi
    # Door effects of this night's set (each door against its parent sets, the cost of
    # exactness), then the door chart over the window's nights that have any door effect.
    step "effects-$(setname "$s")" sh -c '"$@" >"$0"' "$night/effects/$(setname "$s").md" \
        "$bin" effects "$night/$s"
    paying=()
    for d in "${dirs[@]}"; do
        "$bin" effects "$d" --no-write 2>/dev/null | grep -q '^| door |' && paying+=("$d")
    done
    if [ "${#paying[@]}" -eq 0 ]; then
        skipped "doors-$(setname "$s")" "no night of the window has a door configuration beside its parent set"
    else
        step "doors-$(setname "$s")" "$bin" plot --doors "${paying[@]}" --out "$night/plots/$(setname "$s")"
    fi
    step "promote-$(setname "$s")" sh -c '"$@" >"$0"' "$night/promote/$(setname "$s").txt" \
        "$bin" promote --history "${dirs[@]}" "${pn[@]}" --out "$night/promote/$(setname "$s").toml"
done
