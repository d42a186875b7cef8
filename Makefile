# kernelwright — two commands on a fresh machine: `make demo` and `make test`.
# The first target you run creates .venv and installs what it needs (once).
#
# Without a GPU the CPU build of torch is pinned (torch==2.13.0+cpu); a plain `torch` from PyPI
# would pull several GB of CUDA packages. With a GPU (nvidia-smi answers), PyPI's CUDA build.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TORCH_CPU := torch==2.13.0+cpu
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu
TRITON := triton==3.9.0
HAS_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1)
OUT ?= benchmarks/results/latest

.PHONY: demo test test-all lint format gpu-check gpu-test gpu-bench gpu-multi gpu-sweep bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
ifeq ($(HAS_GPU),1)
	$(BIN)/pip install -q torch triton
else
	# CPU build: from a local wheel cache if pip has one, else from PyTorch's CPU index.
	$(BIN)/pip install -q "$(TORCH_CPU)" || \
		$(BIN)/pip install -q "$(TORCH_CPU)" --extra-index-url $(TORCH_CPU_INDEX)
	$(BIN)/pip install -q "$(TRITON)"
endif
	$(BIN)/pip install -q -e ".[dev]"
	touch $(STAMP)

# Verify every library kernel against its reference, then a benchmark table. On a GPU it runs
# there; otherwise through Triton's interpreter on small shapes. Then the create workflow end
# to end on one reference (ReLU²: profile, generated Triton package, its tests).
demo: $(STAMP)
	$(BIN)/kernelwright demo
	$(BIN)/kernelwright create examples/create/relu_squared.py --yes

# The CPU test suite, through Triton's interpreter (also on machines that have a GPU), on two
# workers, each test file whole on one (test_create_library writes into the checkout).
# `make test TEST_ARGS=` runs it in one process; `TEST_ARGS="-n auto --dist loadfile"` on more.
# `test` leaves out the tests marked slow (breadth past one representative case: the other
# architectures' tiny convergence runs, the other generated-kernel families, each op's Hopper
# compile); `test-all` runs them too, as the GPU suite does. One OpenMP thread a worker: the
# workers already fill the cores, and torch's idle threads spin on them.
TEST_ARGS ?= -n 2 --dist loadfile
TEST_ENV := TRITON_INTERPRET=1 OMP_NUM_THREADS=1
test: $(STAMP)
	$(TEST_ENV) $(BIN)/python -m pytest -q -m "not slow" $(TEST_ARGS)

test-all: $(STAMP)
	$(TEST_ENV) $(BIN)/python -m pytest -q $(TEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check src tests && $(BIN)/ruff format --check src tests

format: $(STAMP)
	$(BIN)/ruff format src tests && $(BIN)/ruff check --fix src tests

# On the GPU machine (no venv, no registry: the image's python3 with src/ on the path):
# the whole test suite on the GPU, then every benchmark; CSVs and plots to $(OUT).
# --hide-host times GPU work alone (the CPU's launch overhead is recorded as host_ms).
# gpu-test and gpu-bench are its two halves, for when one call must stay short; OPS picks
# the benchmarked ops (default: all, one run and one summary.md; each op writes <op>.csv);
# FLUSH the timer's L2 flush (read or demote; default demote on sm_80+: docs/benchmarks.md).
OPS ?= all
FLUSH ?=
# absolute: tests run generated packages and the CLI in subprocesses from other folders
GPU_ENV = PYTHONPATH=$(CURDIR)/src:$$PYTHONPATH PYTHONUNBUFFERED=1

gpu-check: gpu-test gpu-bench

gpu-test:
	$(GPU_ENV) $(PYTHON) -m pytest -q tests

gpu-bench:
	for op in $(OPS); do \
		$(GPU_ENV) $(PYTHON) -m kernelwright.cli bench $$op --strict --hide-host $(if $(FLUSH),--flush $(FLUSH)) \
			--out $(OUT) \
		|| exit 1; done

# On a machine of several GPUs (about 6 minutes on 4 H100s): patched vs unpatched models under
# DDP and FSDP2 (Llama; Qwen3 with activation checkpointing; Llama with LoRA), the
# vocabulary-parallel losses against the unsplit op, Liger's and torch's, and one optimize run
# on one GPU and fanned out over all of them (a winner, if any, is applied to this checkout's
# table, as optimize does). Rows and tables under $(OUT)/multi.
gpu-multi:
	$(GPU_ENV) $(PYTHON) benchmarks/distributed_step.py --model llama --out $(OUT)/multi/llama
	$(GPU_ENV) $(PYTHON) benchmarks/distributed_step.py --model qwen3 --checkpointing \
		--out $(OUT)/multi/qwen3
	$(GPU_ENV) $(PYTHON) benchmarks/distributed_step.py --model llama --lora 16 \
		--out $(OUT)/multi/llama_lora
	$(GPU_ENV) $(PYTHON) benchmarks/vocab_parallel.py --tokens 8192 --vocabs 128256 --reps 5 \
		--out $(OUT)/multi/vocab_parallel
	for w in 1 auto; do $(GPU_ENV) $(PYTHON) -m kernelwright.cli optimize rms_norm --yes --quick \
		--max-variants 1 --workers $$w --out $(OUT)/multi/optimize_$$w || exit 1; done

# On a GPU machine: the autopatch sweep (every causal-LM and image-text-to-text model type,
# tiny, patched against unpatched) in each of SWEEP_DTYPES, SWEEP_JOBS workers sharing the
# GPUs; tables gpu_<dtype>[_vlm].csv/.md under $(OUT)/autopatch_sweep (docs/autopatch.md).
SWEEP_DTYPES ?= bf16 fp32
SWEEP_JOBS ?= 8
gpu-sweep:
	for d in $(SWEEP_DTYPES); do $(GPU_ENV) $(PYTHON) -m kernelwright.cli autopatch --sweep \
		--device cuda --dtype $$d --jobs $(SWEEP_JOBS) --out $(OUT)/autopatch_sweep \
		|| exit 1; done

bench: $(STAMP)
	$(BIN)/kernelwright bench all --out $(OUT)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache src/*.egg-info
