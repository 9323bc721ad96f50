# Single entry point. `make demo` and `make test` are the two commands of the README.
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
VENV := .venv
PY := $(VENV)/bin/python
SERVING_PY := .venv-serving/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: help setup demo demo-wd test bench serve clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

setup:  ## install what is missing for this host, CPU or GPU (DLRM_GPU=1|0 overrides); idempotent; `scripts/setup.sh --plan` lists it
	scripts/setup.sh

demo: setup  ## set up, then run the whole pipeline (raw Criteo-format days, preprocessing, 2-rank training, eval, inference, export) small
	scripts/demo.sh

demo-wd: setup  ## set up, then run the Wide & Deep pipeline small (Outbrain-format CSVs, preprocessing, 2-rank training, evaluation; MAP@12 against the teacher's)
	scripts/demo_wd.sh

test: setup  ## set up, then run the whole pytest suite (prints passed/failed/skipped and skip reasons)
	scripts/run_tests.sh

bench: setup  ## run every benchmark under bench/ (JSON in bench/results/, a table on stdout; the CUDA sweep only on a GPU)
	@for b in bench/*.py; do \
		name="$$(basename "$$b" .py)"; \
		grep -q "__main__" "$$b" || continue; \
		if [[ "$$name" == interaction_cuda_sweep ]] && ! nvidia-smi -L >/dev/null 2>&1; then \
			echo "== $$b: skipped (nvidia-smi lists no GPU)"; continue; fi; \
		if [[ "$$name" == serving ]]; then \
			export="$(or $(EXPORT),demo_output/onnx_export)"; \
			if [[ ! -d "$$export" ]]; then echo "== $$b: skipped (no $$export: run make demo, or give EXPORT=<export folder>)"; continue; fi; \
			echo "== $$b"; $(SERVING_PY) -m bench.serving --export "$$export"; continue; fi; \
		echo "== $$b"; $(PY) -m "bench.$$name"; done

serve: setup  ## serve an export folder or model repository with Triton (HTTP 8000, gRPC 8001 on 127.0.0.1): make serve EXPORT=path [SERVE_ARGS="--http_port 9000"]
	@if [[ -z "$(EXPORT)" ]]; then echo "error: give EXPORT=<export folder or model repository> (python -m deployment.export writes one)" >&2; exit 2; fi
	$(SERVING_PY) -m deployment.serve "$(EXPORT)" $(SERVE_ARGS)

clean:  ## remove build outputs (keeps .venv and the wheel cache)
	rm -rf .pytest_cache build
	if [ -f tensorflow-dot-based-interact/Makefile ]; then $(MAKE) -C tensorflow-dot-based-interact clean; fi
