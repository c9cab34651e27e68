#!/usr/bin/env bash
# Issue 23 (the runtime floor: evidence/, capability traits, the safe driver layer, the generated
# door list) on the GPU machine: every GPU test module of the new build, then the default CUDA run
# and `selftest --backend cuda` with the build before the refactor (target-gpu/base/memra-gates)
# and the new one (target-gpu/memra-gates); the receipts' evidence (less the build stamp and the
# performance block) must be byte-for-byte the same. Lines go to stdout and $OUT/issue23.txt.
# ISSUE23_SELFTEST=0 leaves the two selftests out, ISSUE23_TESTS=0 the GPU test modules (shorter calls).
set -uo pipefail
source scripts/gpu/libs.sh
export MEMRA_REQUIRE_GPU=1
exec > >(tee -a "$OUT/issue23.txt") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
[ "${ISSUE23_TESTS:-1}" = 1 ] && bash scripts/gpu/final-check.sh
compare() { python3 scripts/compare_evidence.py "$1" /tmp/base-$1 /tmp/new-$1; }
for b in base new; do
  G=target-gpu/memra-gates; [ $b = base ] && G=target-gpu/base/memra-gates
  t0=$(date +%s); timeout 110 $G run --backend cuda --quiet --out /tmp/$b-run > /tmp/$b-run.log 2>&1
  echo "$b: run --backend cuda exit $? in $(( $(date +%s)-t0 ))s"
done
compare run
if [ "${ISSUE23_SELFTEST:-1}" = 1 ]; then
for b in new base; do
  G=target-gpu/memra-gates; [ $b = base ] && G=target-gpu/base/memra-gates
  t0=$(date +%s); timeout 110 $G selftest --backend cuda --out /tmp/$b-self > /tmp/$b-self.log 2>&1
  echo "$b: selftest --backend cuda exit $? in $(( $(date +%s)-t0 ))s: $(grep -iE 'caught|canar' /tmp/$b-self.log | tail -1)"
done
compare self
fi
tar czf $OUT/issue23-logs.tgz -C /tmp $(cd /tmp && ls base-*.log new-*.log)
