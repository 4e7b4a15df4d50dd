# Clover: `make demo` runs the main job, `make test` runs the whole suite. Both set up the venv.
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed

.PHONY: setup test demo serve lint clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch first, pinned, so pip takes the CPU wheel on disk instead of a CUDA build
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[serve,ray,grammar,bench,dev]'
	touch $(STAMP)

setup: $(STAMP) browser-deps

# chromium + chromedriver (map page browser test) and web/node_modules (map page libraries)
.PHONY: browser-deps
browser-deps:
	bash scripts/install_browser_deps.sh

serve: setup
	$(VENV)/bin/clover serve

lint: setup
	$(VENV)/bin/ruff check clover tests benchmarks

test: setup lint
	$(PY) -m pytest -q

demo: setup
	$(VENV)/bin/clover demo airspace --grounded

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
