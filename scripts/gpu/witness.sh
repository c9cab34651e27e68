#!/usr/bin/env bash
# Issue 26's outside witness on one H200: CUPTI's location, then three subjects with
# `--witness require` (the CUPTI injection library target-gpu/libmemra_witness.so beside G):
# the forged-counter subject (its door must be VOID: the witness counts the same work with it on
# as off), the PyTorch subject (its bf16 door witnessed by the kernels cuBLAS launched), and the
# built-in runtime through the protocol with DEV_ROUTER (a built-in door witnessed from outside).
set -uo pipefail
source scripts/gpu/libs.sh
gpu_call witness
steps_start "${FINAL_DEADLINE:-400}"
echo "CUPTI here: $(find /usr/local /usr/lib /opt -name 'libcupti.so*' 2>/dev/null | head -5 | tr '\n' ' ')"
ls -la target-gpu/
step forge 120 $G run --subject tests/subjects/forge.toml --witness require --backend cuda --matrix single --tp 1,2 --transport host-bounce --prompts 1 --gen-tokens 3 --out $OUT/forge
tail -12 /tmp/forge.log
step torch 200 $G run --subject scripts/subjects/torch.toml --witness require --backend cuda --matrix single --tp 1 --transport host-bounce --out $OUT/torch
tail -12 /tmp/torch.log
step builtin 120 $G run --subject scripts/subjects/builtin.toml --witness require --backend cuda --door MEMRA_STEP_TP_DEV_ROUTER --tp 1,2 --transport host-bounce --prompts 1 --gen-tokens 3 --out $OUT/builtin
tail -12 /tmp/builtin.log
cp /tmp/forge.log /tmp/torch.log /tmp/builtin.log $OUT/ 2>/dev/null
# What the engagement gate said, per receipt.
for d in forge torch builtin; do
  for f in $(ls $OUT/$d/run-*.json 2>/dev/null); do
    python3 - "$f" <<'PY' || true
import json, sys
r = json.load(open(sys.argv[1]))
ev = r["evidence"]
g = [x for x in ev["gates"] if x["gate"] == "engagement"]
c = ev["config"]
outside = {k: v for k, v in ev["census"].items() if k.startswith("outside.")}
print("%-9s tp%d %-28s %-5s witness=%s outside_counters=%d engagement: %s" % (c.get("subject", "?")[:9], c["tp"], ",".join(c["doors"]) or "-", ev["verdict"], ev.get("census_witness"), len(outside), (g[0]["detail"][:160] if g else "-")))
PY
  done
done
# Keep the receipts in one file (the device returns a few files only).
tar czf $OUT/witness-receipts.tgz -C $OUT forge torch builtin && rm -rf $OUT/forge $OUT/torch $OUT/builtin
echo "done in $(( $(date +%s)-STEPS_START ))s"
