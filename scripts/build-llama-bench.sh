#!/usr/bin/env bash
# Builds llama-bench and llama-batched-bench from the llama.cpp source inside the
# llama-cpp-sys-4 crate package that llamactx links, with llama.cpp's own default CMake flags
# (native CPU features, OpenMP) and llamactx's C flags, once: later calls reuse the build.
# Prints the bin directory.
# CMake is $CMAKE when set (the Makefile runs this through scripts/llamactx_build.py).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake=${CMAKE:-cmake}
manifest=$(cargo metadata --format-version 1 --locked 2>/dev/null \
    | python3 -c 'import json,sys; print(next(p["manifest_path"] for p in json.load(sys.stdin)["packages"] if p["name"] == "llama-cpp-sys-4"))')
source_dir="$(dirname "$manifest")/llama.cpp"
version=$(basename "$(dirname "$manifest")")
# One build per C flags (scripts/llamactx_build.py sets them): llamactx's and llama.cpp's match.
flags_id=$(printf '%s' "${CFLAGS:-}" | cksum | cut -d' ' -f1)
build_dir="${LLAMACTX_BENCH_BUILD:-$HOME/.cache/llamactx/llama-bench}/$version-$flags_id"
if [ ! -x "$build_dir/bin/llama-bench" ] || [ ! -x "$build_dir/bin/llama-batched-bench" ]; then
    # Switched off: HTTPS downloads (no network here) and the targets whose sources the crate
    # package leaves out (tests, examples, server, app). CMake options stay llama.cpp's defaults.
    "$cmake" -S "$source_dir" -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DLLAMA_OPENSSL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF >&2
    "$cmake" --build "$build_dir" --target llama-bench llama-batched-bench -j "$(nproc)" >&2
fi
echo "$build_dir/bin"
