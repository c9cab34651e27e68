#!/usr/bin/env bash
# The subject protocol's own exactness test (docs/subject-protocol.md): one short host plan run
# twice — in process, and through the protocol with the built-in runtime as an external subject
# (scripts/subjects/builtin.toml) — must write the same receipts with byte-identical `evidence`.
#
#   scripts/subjects/check-identity.sh [MEMRA_GATES [OUT_DIR [PLAN FLAGS…]]]
#
# Without plan flags, the plan is identity-sets.toml at TP1 and TP2 on the host backend, one
# prompt, three tokens, single-token passes only (CI; protocol version 1 has no rows or columns,
# so an external subject gets no multi-lane configurations to compare). With them, they are the plan (e.g. on a GPU machine:
# `--backend cuda --tp 1,2 --transport host-bounce --door MEMRA_STEP_TP_W8 --prompts 1 --gen-tokens 3`).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
gates="${1:-$here/../../target/release/memra-gates}"
out="${2:-$(mktemp -d)}"
plan=(--matrix "$here/identity-sets.toml" --backend host --tp 1,2 --prompts 1 --gen-tokens 3 --batch 1)
if [ $# -gt 2 ]; then plan=("${@:3}"); fi
plan+=(--quiet)
# Canaries FAIL on purpose (exit 1); anything else but 0 or 1 is a harness error.
run() { "$gates" run "${plan[@]}" "$@" >/dev/null || [ $? -eq 1 ] || { echo "memra-gates run $* failed"; exit 2; }; }
rm -rf "$out/in-process" "$out/protocol"
run --out "$out/in-process"
run --subject "$here/builtin.toml" --out "$out/protocol"
# The one line that differs by design: who counted the census (absent in process, the subject's
# own word through the protocol: `"census_witness": "self-reported"`).
evidence() { sed -n '/^  "evidence": {/,/^  "measurements": {/p' "$1" | sed '$d' | grep -v '^    "census_witness": '; }
n=0
for a in "$out"/in-process/run-*.json; do
    b="$out/protocol/$(basename "$a")"
    [ -f "$b" ] || { echo "the protocol run has no $(basename "$a")"; exit 1; }
    cmp -s <(evidence "$a") <(evidence "$b") || { echo "evidence differs: $(basename "$a")"; diff <(evidence "$a") <(evidence "$b") | head -20; exit 1; }
    n=$((n + 1))
done
m=$(ls "$out"/protocol/run-*.json | wc -l)
[ "$n" -eq "$m" ] && [ "$n" -gt 0 ] || { echo "receipt counts differ: $n in process, $m through the protocol"; exit 1; }
echo "subject protocol: $n receipts, evidence byte-identical in process and through scripts/subjects/builtin.toml"
