# Two commands do all the set-up: `make demo` and `make test`. Each creates .venv when missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export TP_HOME ?= $(CURDIR)/.data
export DAGSTER_HOME ?= $(TP_HOME)/dagster

.PHONY: demo test test-unit ui lint bench clean

$(BIN)/tp: pyproject.toml constraints.txt
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# --no-compile: Python compiles what is imported on first use; compiling every installed module
	# up front took 48 of the install's 82 s here (most of it code the platform never imports).
	$(BIN)/pip install --quiet --no-compile -c constraints.txt -e '.[dev]'
	touch $(BIN)/tp

demo: $(BIN)/tp
	$(BIN)/tp demo

test: $(BIN)/tp
	$(BIN)/ruff check .
	$(BIN)/pytest -q -n 2 --dist loadfile --no-loadscope-reorder

test-unit: $(BIN)/tp
	$(BIN)/pytest -q tests/unit

# The platform server's UI (the same instance `tp` submits to), and the MLflow UI in the foreground:
# Ctrl-C stops the MLflow UI; the platform server goes on until `tp server stop`.
ui: $(BIN)/tp
	$(BIN)/tp server start
	@echo "MLflow UI on http://127.0.0.1:5000 (Ctrl-C stops it)"
	$(BIN)/mlflow ui --host 127.0.0.1 --port 5000 --backend-store-uri sqlite:///$(TP_HOME)/mlflow.db

lint: $(BIN)/tp
	$(BIN)/ruff check .

bench: $(BIN)/tp
	for b in benchmarks/*.py; do $(BIN)/python $$b; done

clean:
	rm -rf .data
