#!/usr/bin/env bash
# CI check: `pip install .` builds llamactx from scratch and imports it on a machine that has
# Rust, Python and a C/C++ compiler but no root and no system libclang or cmake.
#
# Runs in a private mount namespace (needs root here, changes nothing outside): every system
# libclang is hidden (bound to /dev/null), and cmake, apt-get, apt and sudo on PATH fail. The
# build uses a fresh target directory, so llama.cpp compiles in full (tens of minutes on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -z "${BARE_NAMESPACE:-}" ]; then
    exec env BARE_NAMESPACE=1 unshare -m --propagation private "$0" "$@"
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

hidden=0
for lib in /usr/lib/llvm-*/lib/libclang.so* /usr/lib/llvm-*/lib/libclang-[0-9]*.so* \
           /usr/lib/x86_64-linux-gnu/libclang.so* /usr/lib/x86_64-linux-gnu/libclang-[0-9]*.so* \
           /usr/local/lib/libclang*.so*; do
    [ -e "$lib" ] || continue
    mount --bind /dev/null "$lib"
    hidden=$((hidden + 1))
done
mkdir "$work/refuse"
for tool in cmake apt-get apt sudo; do
    printf '#!/bin/sh\necho "%s: not available on this bare machine" >&2\nexit 100\n' "$tool" >"$work/refuse/$tool"
    chmod +x "$work/refuse/$tool"
done
export PATH="$work/refuse:$PATH"
unset LIBCLANG_PATH CMAKE BINDGEN_EXTRA_CLANG_ARGS
echo "bare-build-check: $hidden system libclang files hidden; cmake, apt and sudo refuse" >&2

export CARGO_TARGET_DIR="$work/target"
start=$SECONDS
python3 -m venv "$work/venv"
"$work/venv/bin/python" -m pip install --quiet --upgrade pip
"$work/venv/bin/python" -m pip install --quiet .
cd /
"$work/venv/bin/python" -c "import llamactx; print('bare-build-check: imported llamactx', llamactx.__version__)"
echo "bare-build-check: built and imported in $((SECONDS - start)) s" >&2
