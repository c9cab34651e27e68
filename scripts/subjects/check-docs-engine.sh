#!/usr/bin/env bash
# The documents specify the canonical program completely: scripts/subjects/docs_engine.py, a numpy
# engine written from docs/DESIGN.md §3.4 ("Every operation") and docs/subject-protocol.md alone,
# must PASS as a BIT-IDENTICAL subject on `tiny`, on `edge`, and on a battery long enough for two
# attention partitions (one prompt of at least 4 tokens + 40 generated: positions 0 … ≥ 42, the
# second partition starts at 32) — single-token and in passes of 8 columns — and on a model of odd
# shapes (odd_model.py). Negative controls:
# the same engine with partitions of 64 positions must FAIL the long battery (only a battery past
# 32 positions can tell), with the scale blocks of a K-block folded in reverse the odd model, and
# one that clamps every layer `edge` (whose layer 1 is unclamped).
#
#   scripts/subjects/check-docs-engine.sh [MEMRA_GATES [OUT_DIR]]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
gates="${1:-$here/../../target/release/memra-gates}"
out="${2:-$(mktemp -d)}"
mkdir -p "$out"
python3 -c 'import numpy' 2>/dev/null || { echo "docs_engine.py needs numpy: python3 -m pip install numpy"; exit 2; }
plan=(--backend host --tp 1 --transport host-bounce --quiet)
long=(--prompts 1 --gen-tokens 40)
check() { # name, manifest, expected exit status, plan flags…
    local name=$1 manifest=$2 want=$3 rc=0
    shift 3
    rm -rf "$out/$name"
    timeout 300 "$gates" run --subject "$manifest" "${plan[@]}" "$@" --out "$out/$name" >"$out/$name.log" 2>&1 || rc=$?
    if [ "$rc" -ne "$want" ]; then
        echo "docs engine, $name: exit status $rc, expected $want"
        tail -20 "$out/$name.log"
        exit 1
    fi
    echo "docs engine, $name: exit status $rc as expected"
}
check tiny "$here/docs_engine.toml" 0 --preset tiny
check edge "$here/docs_engine.toml" 0 --preset edge
check tiny-two-partitions "$here/docs_engine.toml" 0 --preset tiny "${long[@]}"
# Columns across the partition boundary: verify passes of 8 tokens (drafts rejected and computed
# again) whose columns attend over one and two partitions (tests/cli/subject_rows.rs runs t2-t8
# on short batteries, with the negative controls).
check tiny-two-partitions-t8 "$here/docs_engine.toml" 0 --preset tiny "${long[@]}" --columns 8
# The negative control: partitions of 64 positions, in a scratch copy.
neg="$out/partition-64"
rm -rf "$neg" && mkdir -p "$neg"
sed 's/^PARTITION = 32$/PARTITION = 64/' "$here/docs_engine.py" >"$neg/docs_engine.py"
cmp -s "$here/docs_engine.py" "$neg/docs_engine.py" && { echo "the negative control planted nothing"; exit 1; }
cp "$here/docs_engine.toml" "$neg/docs_engine.toml"
check partition-64-long "$neg/docs_engine.toml" 1 --preset tiny "${long[@]}"
grep -q 'attn' "$out/partition-64-long.log" || { echo "the partition-64 engine failed, but not at an attn seam"; exit 1; }
# The shapes no preset has (odd_model.py: BF16 K-blocks of 48 columns, a 384-wide row norm, E4M3
# K-blocks of 3 and 5 scale blocks, grouped-query attention, no SwiGLU limit, no route
# normalisation), past one attention partition too.
python3 "$here/odd_model.py" "$out/odd.safetensors"
check odd "$here/docs_engine.toml" 0 --model "$out/odd.safetensors" --prompts 2 --gen-tokens 36
# Negative control: the scale blocks of a K-block folded in reverse (a defect no preset can show:
# their K-blocks are one scale block each) must FAIL on the odd model at the experts seam.
sed 's/^        for j in range(per):$/        for j in reversed(range(per)):/' "$here/docs_engine.py" >"$neg/docs_engine.py"
cmp -s "$here/docs_engine.py" "$neg/docs_engine.py" && { echo "the negative control planted nothing"; exit 1; }
check odd-scale-blocks-reversed "$neg/docs_engine.toml" 1 --model "$out/odd.safetensors" --prompts 1 --gen-tokens 2
grep -q 'experts' "$out/odd-scale-blocks-reversed.log" || { echo "the reversed engine failed, but not at an experts seam"; exit 1; }
# Negative control: an engine that clamps every layer (ignoring `unclamped_layers`) must FAIL on
# edge, whose layer 1 is unclamped and reaches the clamp rows, at an experts seam.
sed 's/None if i in m.unclamped else m.limit)$/m.limit)/' "$here/docs_engine.py" >"$neg/docs_engine.py"
cmp -s "$here/docs_engine.py" "$neg/docs_engine.py" && { echo "the negative control planted nothing"; exit 1; }
check edge-every-layer-clamped "$neg/docs_engine.toml" 1 --preset edge --prompts 1 --gen-tokens 2
grep -q 'experts' "$out/edge-every-layer-clamped.log" || { echo "the every-layer-clamped engine failed, but not at an experts seam"; exit 1; }
echo "docs engine: BIT-IDENTICAL on tiny, edge, two attention partitions and the odd shapes; all three planted defects caught"
