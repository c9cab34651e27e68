#!/usr/bin/env bash
# The binaries a device call carries, built here (the device machine has no cargo):
#   bash scripts/gpu/carry.sh NAME [CHECKOUT]
# builds CHECKOUT (default: this checkout; a worktree of a branch to measure) in release and copies
# `memra-gates` and the runtime's GPU test binary, stripped, to target-g/mg-NAME and
# target-g/gpu-NAME of this checkout (ignored; pass `carry: ["target-g"]` to the device call). The
# test binary's path is the one cargo prints for this build, so a stale binary from an earlier
# build of other kernels cannot be carried by mistake.
set -euo pipefail
name=${1:?usage: carry.sh NAME [CHECKOUT]}
here=$(pwd)
src=$(cd "${2:-.}" && pwd)
(cd "$src" && cargo build --release -q)
gpu=$(cd "$src" && cargo test --release -p memra-runtime --test gpu --no-run 2>&1 |
  grep -o 'target/release/deps/gpu-[0-9a-f]*' | tail -1)
[ -n "$gpu" ] || { echo "carry.sh: cargo printed no GPU test executable for $src" >&2; exit 1; }
mkdir -p "$here/target-g"
cp "$src/target/release/memra-gates" "$here/target-g/mg-$name"
cp "$src/$gpu" "$here/target-g/gpu-$name"
strip "$here/target-g/mg-$name" "$here/target-g/gpu-$name"
echo "target-g/mg-$name, target-g/gpu-$name ($(cd "$src" && git rev-parse --short HEAD)$(cd "$src" && git diff --quiet || echo ', uncommitted changes')); target-g holds $(du -sh "$here/target-g" | cut -f1) (carry limit 64 MiB with the tree)"
