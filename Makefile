# Two commands do all the set-up: `make demo` and `make test`. Each creates .venv when missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export TP_HOME ?= $(CURDIR)/.data
export DAGSTER_HOME ?= $(TP_HOME)/dagster

.PHONY: demo test test-unit ui lint bench clean

$(BIN)/tp: pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(BIN)/tp

demo: $(BIN)/tp
	$(BIN)/tp demo

test: $(BIN)/tp
	$(BIN)/ruff check .
	$(BIN)/pytest -q

test-unit: $(BIN)/tp
	$(BIN)/pytest -q tests/unit

ui: $(BIN)/tp
	mkdir -p $(DAGSTER_HOME)
	@echo "MLflow UI on http://127.0.0.1:5000, Dagster UI on http://127.0.0.1:3000"
	$(BIN)/mlflow ui --host 127.0.0.1 --port 5000 \
		--backend-store-uri sqlite:///$(TP_HOME)/mlflow.db & \
	trap 'kill $$!' EXIT; $(BIN)/dagster dev -h 127.0.0.1 -p 3000 -w workspace.yaml

lint: $(BIN)/tp
	$(BIN)/ruff check .

bench: $(BIN)/tp
	for b in benchmarks/*.py; do $(BIN)/python $$b; done

clean:
	rm -rf .data
