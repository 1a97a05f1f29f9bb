#!/usr/bin/env bash
# Builds the engine core crate's example (crates/llamactx-engine) with no Python on PATH and no
# PyO3 settings, then runs it: the core is a Rust library that needs no Python to build or run.
#
#   scripts/core_without_python.sh [MODEL]      (run from the repository, after `make build`)
#
# The toolchain settings scripts/llamactx_build.py gives every build (libclang and cmake from the
# venv's wheels, the C flags) are read first; the build then runs in an environment of those
# alone, whose PATH holds every program of the system's bin directories but Python's. It uses a
# target directory of its own (CARGO_TARGET_DIR, default ~/.cache/llamactx/without-python):
# llama.cpp's build script watches the environment, so sharing the main one would rebuild it.
# Not part of `make test` (a build of llama.cpp, ~9 minutes on 2 cores); docs/testing.md.
set -euo pipefail

model=${1:-$HOME/.cache/llamactx/models/SmolLM2-135M-Instruct.Q4_1.gguf}
target=${CARGO_TARGET_DIR:-$HOME/.cache/llamactx/without-python}
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
for program in /usr/local/bin/* /usr/bin/* /bin/* /usr/local/sbin/* /usr/sbin/*; do
    name=${program##*/}
    case $name in *python* | pip* | pydoc* | py3* | pygettext* | *.py) continue ;; esac
    [ -e "$bin/$name" ] || ln -s "$program" "$bin/$name"
done

settings=()
while IFS= read -r line; do
    case $line in LIBCLANG_PATH=* | CMAKE=* | BINDGEN_EXTRA_CLANG_ARGS=* | CFLAGS=* | CXXFLAGS=*) settings+=("$line") ;; esac
done < <(.venv/bin/python scripts/llamactx_build.py env)

env -i HOME="$HOME" PATH="$bin:$HOME/.cargo/bin" CARGO_TARGET_DIR="$target" "${settings[@]}" bash -c '
    if command -v python3 python >/dev/null; then echo "a Python is on PATH" >&2; exit 1; fi
    cargo build --release -p llamactx-engine --example engine_stream
    example="$CARGO_TARGET_DIR/release/examples/engine_stream"
    if ldd "$example" | grep -q libpython; then echo "the example links libpython" >&2; exit 1; fi
    "$example" "$1" 8 "The capital of France is"
' core_without_python "$model"
