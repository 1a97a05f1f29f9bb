#!/usr/bin/env bash
# Runs an expensive CI step only when what it reads changed since it last passed on this machine.
#
#   scripts/ci_cached.sh NAME COMMAND [ARG...]
#
# The key is a hash of the build's inputs (BUILD_INPUTS below) and of the step's command line.
# After COMMAND exits 0 the key is written to $CI_CACHE/NAME; a later run whose key is the same
# skips COMMAND and says so. A change to any input, or a machine without the record (a new one),
# runs it in full. LLAMACTX_CI_FULL=1 runs it whatever the record says.
set -euo pipefail
cd "$(dirname "$0")/.."

# What the wheel builds and the from-scratch build read: the Rust manifests and lock, the build
# script and the C++ it compiles, the Python build backend and wheel scripts, the packaging and
# requirements, the Makefile that drives them, and the CPU-level selection the wheel ships.
BUILD_INPUTS=(
    Cargo.lock Cargo.toml crates/llamactx-engine/Cargo.toml build.rs rust-toolchain.toml src/*.cpp
    pyproject.toml requirements-dev.txt Makefile .ci/run
    scripts/llamactx_build.py scripts/portable_wheel.py scripts/bare-build-check.sh scripts/ci_cached.sh
    src/cpu.rs python/llamactx/_cpu.py
)

name=$1
shift
cache=${CI_CACHE:-$HOME/.cache/llamactx/ci-passed}
key=$( { sha256sum "${BUILD_INPUTS[@]}"; printf '%s\n' "$*"; } | sha256sum | cut -d' ' -f1)
record="$cache/$name"

if [ -z "${LLAMACTX_CI_FULL:-}" ] && [ -f "$record" ] && [ "$(cat "$record")" = "$key" ]; then
    echo "ci_cached: $name skipped: it passed on this machine with the same build inputs (key $key)" >&2
    exit 0
fi
echo "ci_cached: $name runs (key $key)" >&2
"$@"
mkdir -p "$cache"
printf '%s\n' "$key" >"$record"
echo "ci_cached: $name passed; recorded" >&2
