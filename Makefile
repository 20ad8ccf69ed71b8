# Two commands do all the set-up: `make demo` and `make test`. Each creates .venv when missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export TP_HOME ?= $(CURDIR)/.data
export DAGSTER_HOME ?= $(TP_HOME)/dagster
# Bytecode is cached (in .venv and in __pycache__, which git ignores) whatever the shell says: with
# PYTHONDONTWRITEBYTECODE set, each of the hundreds of processes a demo or the suite starts (servers, jobs, `tp`)
# compiled the libraries it imports from source again (measured: `import torch` 5.2 s of CPU, 1.8 s from bytecode;
# Great Expectations 9.9 s, 3.9 s; `tp train --help` 1.2 s, 0.6 s).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: demo test test-unit ui lint bench device-kit clean

$(BIN)/tp: pyproject.toml constraints.txt
	# A .venv left half-made (an install stopped before pip was in place) is made again, not used as it is.
	test -x $(BIN)/pip || $(PYTHON) -m venv --clear $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# The pinned set goes in as two halves at once: pip installs one wheel at a time, and writing their files is
	# most of its work (one core busy for 42 s here; the venv in all: 46.6 s -> 31.7 s). The project's own install
	# then finds every pin in place, and installs whatever the pins lack. --no-compile: Python compiles what is
	# imported on first use; compiling every installed module up front took 48 of the install's 82 s here (most of
	# it code the platform never imports).
	awk '/^[A-Za-z0-9]/ { print > ("$(VENV)/pins-" (n++ % 2 + 1) ".txt") }' constraints.txt
	$(BIN)/pip install --quiet --no-compile --no-deps -r $(VENV)/pins-1.txt & first=$$!; \
		$(BIN)/pip install --quiet --no-compile --no-deps -r $(VENV)/pins-2.txt; second=$$?; \
		wait $$first && test $$second = 0
	$(BIN)/pip install --quiet --no-compile -c constraints.txt -e '.[dev]'
	touch $(BIN)/tp

demo: $(BIN)/tp
	$(BIN)/tp demo

# Three workers on two cores: with two, a fifth of the cores sat idle (both workers' tests waiting at once on Slurm's
# holds, a cron minute, a paced run); three keep them 92-97% busy (fresh clones here: 1413-1618 s, against 1596 s with
# two in the same week). `TEST_WORKERS=2` runs two.
TEST_WORKERS ?= 3

test: $(BIN)/tp
	$(BIN)/ruff check .
	$(BIN)/lint-imports --no-logo
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# The unit tier alone, in under 3 minutes: two workers, tests dealt one at a time (no module shares a service).
test-unit: $(BIN)/tp
	$(BIN)/pytest -q -n 2 --dist load tests/unit

# The platform server's UI (the same instance `tp` submits to), and the MLflow UI in the foreground:
# Ctrl-C stops the MLflow UI; the platform server goes on until `tp server stop`.
ui: $(BIN)/tp
	$(BIN)/tp server start
	@echo "The platform's UI asks for a token: paste the one \`$(BIN)/tp token\` prints" >&2
	@echo "MLflow UI on http://127.0.0.1:5000 (Ctrl-C stops it)"
	$(BIN)/mlflow ui --host 127.0.0.1 --port 5000 --backend-store-uri sqlite:///$(TP_HOME)/mlflow.db

lint: $(BIN)/tp
	$(BIN)/ruff check .
	$(BIN)/lint-imports --no-logo

bench: $(BIN)/tp
	for b in benchmarks/*.py; do $(BIN)/python $$b; done

# Wheels of what a GPU machine's python3 lacks (it has torch, numpy, pytest, psutil, ...), at the versions this
# venv tests, for benchmarks/device_checks.sh. DeepSpeed is built here as a pure-Python wheel (its ops compile on
# first use; the platform's DeepSpeed strategy uses none).
DEVICE_PYTHON ?= 3.12
DEVICE_WHEELS := pydantic pydantic_core annotated_types typing_inspection blake3 hjson
device-kit: $(BIN)/tp
	rm -rf .whl && mkdir .whl
	$(BIN)/pip download --quiet --no-deps --only-binary=:all: --python-version $(DEVICE_PYTHON) --implementation cp \
		--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
		$$($(BIN)/python -c 'import sys, importlib.metadata as m; print(*(f"{n}=={m.version(n)}" for n in sys.argv[1:]))' $(DEVICE_WHEELS))
	DS_BUILD_OPS=0 $(BIN)/pip wheel --quiet --no-deps --no-build-isolation -w .whl \
		deepspeed==$$($(BIN)/python -c 'import importlib.metadata as m; print(m.version("deepspeed"))')
	du -sh .whl

clean:
	rm -rf .data
