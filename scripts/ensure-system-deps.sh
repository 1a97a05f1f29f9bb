#!/usr/bin/env bash
# Installs what building llama.cpp through llama-cpp-sys-4 needs and a bare
# Debian machine lacks: libclang (for bindgen) and cmake. Does nothing when present.
set -euo pipefail

need=()
command -v cmake >/dev/null 2>&1 || need+=(cmake)
if ! ls /usr/lib/llvm-*/lib/libclang*.so* /usr/lib/x86_64-linux-gnu/libclang*.so* >/dev/null 2>&1; then
    need+=(libclang-dev)
fi
command -v c++ >/dev/null 2>&1 || need+=(g++)
[ ${#need[@]} -eq 0 ] && exit 0

echo "installing system packages: ${need[*]}" >&2
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}"
