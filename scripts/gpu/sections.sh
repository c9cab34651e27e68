#!/usr/bin/env bash
# Sourced by the GPU scripts (scripts/gpu/issue12.sh, gates.sh): a time budget shared by sections,
# and one section that runs a module of the GPU test binary. Expects: $dir (the executables), $out
# (the scratch folder for logs), $rc (set to 1 on any failure), BUDGET (seconds, default 470).

newest() {
    for f in $(ls -t "$dir/$1"-* 2>/dev/null); do
        case "$f" in *.d) continue ;; esac
        [ -x "$f" ] && { echo "$f"; return; }
    done
}

# Every section gets at most its own limit and what is left of BUDGET seconds (default 470: one
# device call of ≤ 8 minutes); a section with under 30 s left is skipped, and says so.
budget="${BUDGET:-470}"
start=$(date +%s)
limit() { # wanted seconds -> granted seconds (0: skip)
    local left=$(( budget - ($(date +%s) - start) ))
    if [ "$left" -lt 30 ]; then echo 0; elif [ "$1" -lt "$left" ]; then echo "$1"; else echo "$left"; fi
}

run_tests() { # module seconds extra-env... (a module of the one GPU test binary, gpu-<hash>)
    local name="$1" secs
    secs=$(limit "$2")
    shift 2
    if [ "$secs" -eq 0 ]; then
        echo "!! $name skipped: the time budget is spent"
        rc=1
        return
    fi
    local bin
    bin=$(newest gpu)
    if [ -z "$bin" ]; then
        echo "!! no gpu test executable in $dir"
        rc=1
        return
    fi
    echo "== $name ($bin, ≤ ${secs}s)"
    env "$@" timeout "$secs" "$bin" --test-threads=1 "$name::" > "$out/$name.log" 2>&1 || rc=1
    grep -E '^(grouped experts|step model|host oracle|step preset)|^test .*(FAILED|ok|ignored.*)$|^test result' "$out/$name.log" | head -60
    if grep -q FAILED "$out/$name.log"; then
        # With --nocapture the panic messages are inline: each with the lines that follow it.
        grep -E -A6 "panicked at" "$out/$name.log" | grep -vE '^\s+[0-9]+: |^\s+at |^note: |^stack backtrace' | head -80
    fi
}

