# tlab: `make validate` sets up and runs the validation routine; `make test` sets up and tests.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
EXTRAS ?= dev,joblib,submitit,bench,reference,hf,text,optuna,tensorboard,mlflow

.PHONY: setup validate test lint bench clean

setup: $(VENV)/.installed

# constraints.txt pins the CPU build of torch from the local wheel store (users bring their own).
$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -c constraints.txt -e ".[$(EXTRAS)]"
	touch $@

validate: setup
	$(BIN)/tlab validate

test: setup
	$(BIN)/pytest -n auto

lint: setup
	$(BIN)/ruff check .

bench: setup
	$(BIN)/python -m benchmarks.run

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
