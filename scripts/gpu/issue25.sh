#!/usr/bin/env bash
# Issue 25 on the GPU machine: two nights of the nightly recipe (`--matrix single`, CUDA) so the
# door chart, the promotion table with its performance column and the cost-of-exactness line have
# a window, then `bench` with the PyTorch anchor in every form. Summary lines to stdout and
# $OUT/issue25.txt; the nights' reports, charts and the bench receipt in $OUT/issue25.tgz.
set -uo pipefail
source scripts/gpu/libs.sh
exec > >(tee -a "$OUT/issue25.txt") 2>&1
G=target-gpu/final/memra-gates
N=/tmp/nights
for n in night1 night2; do
  t0=$(date +%s)
  timeout 200 scripts/nightly.sh --backend cuda --bin $G --matrix single --nights $N --name $n --history 2 \
    --step-args skip --selftest-args skip --bench-args skip > /tmp/$n.log 2>&1
  echo "$n: exit $? in $(( $(date +%s)-t0 ))s; $(head -1 $N/$n/report.md)"
done
sed -n '/[Dd]oor effects/,/^## [A-Z]/p' $N/night2/report.md | head -60
head -30 $N/night2/promote/matrix.txt
t0=$(date +%s)
timeout 240 $G bench --backend cuda --preset step --layers 2 --graph --out /tmp/bench > /tmp/bench.log 2>&1
echo "bench exit $? in $(( $(date +%s)-t0 ))s"; grep -iE "pytorch|form|fastest|layer|floor" /tmp/bench.log | head -30
tar czf $OUT/issue25.tgz -C /tmp nights bench bench.log night1.log night2.log
