# The one entry point: `make demo` and `make test` do all set-up themselves.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV ?= .venv
PY := $(VENV)/bin/python
# Outside the checkout, so that fresh clones reuse the (long) llama.cpp build.
export CARGO_TARGET_DIR ?= $(HOME)/.cache/llamactx/target
# Answered greedily: the default model's answer holds on every CPU build (tests/project/test_cli.py checks
# the margin of each token; sampled, or asked without "in one sentence", it wanders).
QUESTION ?= What is the capital of France? Answer in one sentence.
WHEEL_VENV ?= .venv-wheel
PEERS_VENV ?= .venv-peers
# The cargo target directories of the wheel's builds, one per CPU level, and the venv of their
# build tools (outside the checkout too, at a fixed path: see scripts/portable_wheel.py).
WHEEL_TARGETS ?= $(HOME)/.cache/llamactx/wheel
# Every build runs with the native toolchain (libclang, cmake) from the venv's PyPI wheels.
# The instruction sets scripts/llamactx_build.py compiles out of llama.cpp on x86-64, for the peers too.
X86_FLAGS = $(shell python3 -c 'import os, sys; sys.path.insert(0, "scripts"); import llamactx_build; print(llamactx_build.x86_flags(os.environ))')
TOOLCHAIN := PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) scripts/llamactx_build.py
# Python keeps the compiled package and tests (__pycache__, which git ignores) even where the
# environment says not to: the tests start hundreds of Python children, and each compiled them
# again (2.4 of 23 CPU seconds in test_misuse_raises.py and test_cli.py).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: help demo test test-profile lint fuzz bench bench-peers wheel wheel-venv test-wheel test-cpu-builds build model clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

demo: build model ## set up, then let the default model answer a question through its chat template
	$(PY) -m llamactx chat "$(QUESTION)" --max-tokens 128 --greedy --stats

# The Python tests run on a worker per CPU, each keeping to its own (tests/conftest.py) and running
# whole modules (their module fixtures computed once), then, one at a time on the whole machine,
# the few that need more than one CPU (marked whole_machine).
PYTEST_PARALLEL := -n auto --dist loadscope -m "not whole_machine"
PYTEST_SERIAL := -m whole_machine

test: build model ## set up, then run the Rust unit tests, the Python tests and stubtest
	$(TOOLCHAIN) cargo test --release --workspace --lib
	$(PY) -m pytest $(PYTEST_PARALLEL)
	$(PY) -m pytest $(PYTEST_SERIAL)
	$(PY) -m mypy.stubtest llamactx._llamactx --allowlist .mypy-stubtest-allowlist

test-profile: build model ## the Python tests' seconds per file, slowest first, for each of make test's two passes (docs/testing.md)
	$(PY) scripts/test_profile.py $(PYTEST_PARALLEL)
	$(PY) scripts/test_profile.py $(PYTEST_SERIAL)

fuzz: build model ## the long runs: the API fuzzer with 20,000 examples (300 in `make test`), every JSON Schema of the corpus decoded (a share in `make test`)
	LLAMACTX_FUZZ_EXAMPLES=20000 $(PY) -m pytest tests/hostile/test_fuzz.py --timeout=7200
	LLAMACTX_SCHEMA_CORPUS=all $(PY) -m pytest tests/generation/test_structured.py -k corpus

bench: build model bench-peers wheel-venv ## llamactx vs llama.cpp's tools (built from the same source), llama-cpp-python and llama.cpp's server, the wheel vs the native build, over RPC and through Ray Data vs local; JSON+PNG in bench-results/
	$(PY) -m pip install --quiet matplotlib
	$(PY) benches/compare.py --bin "$$($(TOOLCHAIN) scripts/build-llama-bench.sh)" --peer-python $(PEERS_VENV)/bin/python
	$(PY) benches/wheel.py --bin "$$($(TOOLCHAIN) scripts/build-llama-bench.sh)" --wheel-python $(WHEEL_VENV)/bin/python --rounds 21
	$(PY) benches/server.py --peer-python $(PEERS_VENV)/bin/python
	$(PY) benches/server_suite.py --peer-python $(PEERS_VENV)/bin/python
	$(PY) benches/structured.py --peer-python $(PEERS_VENV)/bin/python
	$(PY) benches/rerank.py --peer-python $(PEERS_VENV)/bin/python
	$(PY) benches/templates.py --peer-python $(PEERS_VENV)/bin/python
	$(PY) benches/prompt_cache.py
	$(PY) benches/speculative.py
	$(PY) benches/media.py
	$(PY) benches/kv_cache_types.py
	$(PEERS_VENV)/bin/python benches/forged_turns.py "$$($(PY) -c 'import llamactx; print(llamactx.default_model_path())')"
	$(PY) benches/rpc.py
	$(PY) tests/support/loopback_only.py benches/ray_data.py  # Ray listens on every interface: loopback only here

bench-peers: ## the peers of make bench in their own venv: llama-cpp-python 0.3.36 with its server (builds for ~7 minutes, once) and xllamacpp (llama.cpp's server, prebuilt)
	test -x $(PEERS_VENV)/bin/python || python3 -m venv $(PEERS_VENV)
	# AMX and AVX-512 compiled out, as scripts/llamactx_build.py does for llamactx (SIGILL otherwise
	# on VMs whose CPUs report AMX); its server predates sse-starlette 2.2 and fastapi 0.116.
	CFLAGS="$(X86_FLAGS)" CXXFLAGS="$(X86_FLAGS)" $(PEERS_VENV)/bin/python -m pip install --quiet --no-cache-dir \
		numpy openai jsonschema xllamacpp "llama-cpp-python[server]==0.3.36" "sse-starlette<2.2" "fastapi<0.116"

wheel: $(VENV)/.deps ## the portable release wheel in dist/: abi3, manylinux_2_28, one build per x86-64 CPU level (3 builds with zig, cached in WHEEL_TARGETS)
	rm -rf dist
	$(PY) scripts/portable_wheel.py --out dist --targets $(WHEEL_TARGETS)

# What the wheel's tests run: every test of the compiled extension's own surface (the context, the
# engine, media, RPC, the command line, stubs and docstrings, the CPU builds under QEMU) and one
# of the server from the wheel's extras. The rest (the server's protocols, structured output,
# speculation, Ray, the fuzzer) is the same Python over these calls, run by `make test`.
WHEEL_TESTS = project/test_cpu_builds project/test_import project/test_docs context/test_model context/test_context \
	context/test_compute context/test_kv context/test_state generation/test_sampler context/test_outputs \
	context/test_errors context/test_all_or_nothing engine/test_engine generation/test_highlevel media/test_media \
	media/test_audio distributed/test_rpc project/test_cli hostile/test_guards server/openai_surface/test_basic
test-wheel: wheel-venv model ## install the wheel into a bare venv (no Rust needed) and run the extension's tests from it, natively and under QEMU as older CPUs (Debian's qemu-user)
	$(WHEEL_VENV)/bin/python -m pytest $(patsubst %,tests/%.py,$(WHEEL_TESTS))

# The tests whose assertions are equalities between paths (the engine and generate, drafts and
# none, a state restored and a fresh one, an aborted decode and none, the demo's answer), from the
# wheel, with each of its CPU builds that this CPU runs forced in turn: what they assert must not
# hang on one build's kernels.
EQUALITY_TESTS = engine/test_engine context/test_state engine/test_speculative engine/test_speculative_generation \
	generation/test_highlevel context/test_kv context/test_all_or_nothing project/test_cli
test-cpu-builds: wheel-venv model ## the equality tests from the wheel, with each CPU build this machine can run forced in turn
	for build in $$($(WHEEL_VENV)/bin/python -c "from llamactx import _cpu; cpu = set(_cpu.cpu_variant().features); print(*(b.name for b in _cpu.BUILDS if b.needs <= cpu))"); do \
		echo "== LLAMACTX_CPU_BUILD=$$build"; \
		LLAMACTX_CPU_BUILD=$$build $(WHEEL_VENV)/bin/python -m pytest -q $(patsubst %,tests/%.py,$(EQUALITY_TESTS)) || exit 1; \
	done

wheel-venv: wheel ## the wheel installed into a bare venv, WHEEL_VENV
	rm -rf $(WHEEL_VENV)
	python3 -m venv $(WHEEL_VENV)
	$(WHEEL_VENV)/bin/python -m pip install --quiet "$$(ls dist/llamactx-*.whl)[server,ray]" pytest pytest-timeout hypothesis gguf openai anthropic httpx "jsonschema[format-nongpl]"
	cd / && $(CURDIR)/$(WHEEL_VENV)/bin/python -c "import llamactx, sys; assert '$(WHEEL_VENV)/lib' in llamactx.__file__, llamactx.__file__"

lint: build ## rustfmt, clippy, ruff, mypy --strict and actionlint
	cargo fmt --all --check
	$(TOOLCHAIN) cargo clippy --release --workspace --all-targets -- -D warnings
	$(PY) -m ruff check python tests benches scripts
	$(PY) -m ruff format --check python tests benches scripts
	$(PY) -m mypy --strict python/llamactx tests/support/children
	$(PY) scripts/stub_docstrings.py --check
	rm -rf .readme-examples && $(PY) scripts/readme_examples.py .readme-examples
	$(PY) -m mypy --strict .readme-examples
	$(VENV)/bin/actionlint .github/workflows/*.yml

build: $(VENV)/.deps ## compile the extension into the virtual environment, with the server and ray extras
	$(TOOLCHAIN) maturin develop --release --quiet --extras server,ray

model: build ## fetch the default model into the cache (once)
	$(PY) -c "import llamactx; print(llamactx.default_model_path())"

$(VENV)/.deps: requirements-dev.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $@

clean: ## remove the virtual environments and wheels (the cached build and model stay)
	rm -rf $(VENV) $(WHEEL_VENV) dist
