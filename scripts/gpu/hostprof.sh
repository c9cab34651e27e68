#!/usr/bin/env bash
# Where a CUDA matrix job's host time goes (issue 24): perf, carried from the dev machine with its
# libraries behind the system's, samples one process running a shard of tiny's plan, with call
# graphs (--call-graph dwarf: the carried memra-gates keeps its symbol table and .eh_frame, so
# build it with `strip --strip-debug`, not `strip`). Carry target-prof/ (memra-gates, perfkit/ =
# /usr/bin/perf and the libraries `ldd` lists for it, less libc, libm and the loader).
#   bash scripts/gpu/hostprof.sh [SECONDS] [TP SHARD]...    e.g. 540 "2 3/256" "8 3/512"
source scripts/gpu/libs.sh
gpu_call hostprof
G=target-prof/memra-gates
P=target-prof/perfkit/perf
export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$PWD/target-prof/perfkit/lib"
steps_start "${1:-540}"; shift
[ $# -gt 0 ] || set -- "2 3/256"
echo "paranoid: $(cat /proc/sys/kernel/perf_event_paranoid)"; $P --version
nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader -lms 200 > /tmp/util.csv &
for lane in "$@"; do
  read -r tp sh <<< "$lane"; n=tp$tp
  step prof_$n 100 $P record -e cpu-clock -F 499 --call-graph dwarf,16384 -o /tmp/$n.data -- \
    "$G" run --matrix all --backend cuda --preset tiny --tp "$tp" --transport native-p2p --shard "$sh" --out /tmp/m_$n
  grep -E "PASS|FAIL" /tmp/prof_$n.log | tail -1
  $P report -i /tmp/$n.data --no-children --stdio --sort dso,sym --percent-limit 0.4 -g none > "$OUT/$n-flat.txt" 2>&1
  $P report -i /tmp/$n.data --children --stdio --sort sym --percent-limit 1 -g none > "$OUT/$n-incl.txt" 2>&1
  grep -v "^#" "$OUT/$n-incl.txt" | grep -v "^$" | head -60
  tar czf "$OUT/m_$n.tgz" -C /tmp m_$n 2>/dev/null
done
kill %1; awk '{s+=$1; n++} END {print "GPU busy mean", s/n, "% over", n, "samples"}' /tmp/util.csv
