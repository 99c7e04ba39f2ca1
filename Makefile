# `make demo` and `make test` are all a fresh clone needs: they install the
# system packages (a CJK font for Chinese labels), create .venv, install attnlab
# with every extra, then run.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.attnlab-installed
DEMO_DIR ?= attnlab-demo

.PHONY: setup demo test clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt scripts/install-system-deps.sh
	bash scripts/install-system-deps.sh
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[all,test]"
	touch $(STAMP)

demo: setup
	$(BIN)/attnlab explain --out $(DEMO_DIR)/explain
	$(BIN)/attnlab inspect --out $(DEMO_DIR)/inspect
	@echo "demo outputs are in $(DEMO_DIR)/: explain/ (seed 000's example: heatmap.png, heatmap.svg,"
	@echo "trace.json, trace.md) and inspect/ (all-MiniLM-L6-v2: grid.png, head.png, view.html,"
	@echo "diagnostics.json)"

test: setup
	$(BIN)/ruff check src tests benchmarks scripts
	$(BIN)/mypy
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) $(DEMO_DIR) .pytest_cache .mypy_cache .ruff_cache .hypothesis
