# `make demo` and `make test` are all a fresh clone needs: they install the
# system packages (a CJK font for Chinese labels), create .venv, install attnlab
# with every extra, then run. `make test` also creates .venv-core, which holds
# NumPy and the test runner only, and runs tests/core there: the NumPy core must
# work without torch or matplotlib.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.attnlab-installed
DEMO_DIR ?= attnlab-demo
CORE_VENV  ?= .venv-core
CORE_BIN   := $(CORE_VENV)/bin
CORE_STAMP := $(CORE_VENV)/.attnlab-installed

.PHONY: setup demo test docs clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt scripts/install-system-deps.sh
	bash scripts/install-system-deps.sh
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[all,test,docs]"
	touch $(STAMP)

# NumPy, pytest and hypothesis at the pinned versions, and attnlab without its extras.
$(CORE_STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(CORE_VENV)
	$(CORE_BIN)/python -m pip install --quiet -c constraints.txt numpy pytest hypothesis
	$(CORE_BIN)/python -m pip install --quiet --no-deps -e .
	touch $(CORE_STAMP)

demo: setup
	$(BIN)/attnlab explain --out $(DEMO_DIR)/explain
	$(BIN)/attnlab inspect --out $(DEMO_DIR)/inspect
	@echo "demo outputs are in $(DEMO_DIR)/: explain/ (seed 000's example: heatmap.png, heatmap.svg,"
	@echo "trace.json, trace.md) and inspect/ (all-MiniLM-L6-v2: grid.png, head.png, view.html,"
	@echo "diagnostics.json)"

# The documentation site, into site/ (strict: a broken link, a missing page or an API
# name that no longer exists fails it). The tutorial notebooks are executed once and
# cached in .cache/ by their content (scripts/executed_notebooks.py: tests/tutorial
# reads the same executions); the kernel is this venv's python.
docs: setup
	NO_MKDOCS_2_WARNING=1 PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m mkdocs build --strict --quiet

# Lint and types; the whole suite, in two processes (a test file stays in one: see
# tests/conftest.py); the numerics tiers again under every OpenBLAS kernel the CPU
# can run, with torch at 1 and 2 threads (scripts/test-numerics.sh says which runs);
# tests/core where only NumPy is installed. The site is built
# first, strictly, and tests/docs opens that build in headless Chromium.
test: setup $(CORE_STAMP) docs
	$(BIN)/ruff check src tests benchmarks scripts
	$(BIN)/mypy
	ATTNLAB_DOCS_SITE=site $(BIN)/python -m pytest -n 2 --dist loadfile
	bash scripts/test-numerics.sh --skip-covered $(BIN)/python
	$(CORE_BIN)/python -c 'import importlib.util as u, sys; extra = [m for m in ("torch", "matplotlib") if u.find_spec(m)]; extra and sys.exit(f"$(CORE_VENV) has {extra}: tests/core must run without them")'
	$(CORE_BIN)/python -m pytest tests/core

clean:
	rm -rf $(VENV) $(CORE_VENV) $(DEMO_DIR) site .cache .pytest_cache .mypy_cache .ruff_cache .hypothesis
