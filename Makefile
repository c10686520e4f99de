# Developer tasks. Everything runs in the project virtual environment (.venv), made on first
# use by scripts/_venv.sh.
SHELL := /bin/bash

BENCH_JSON := .benchmarks/latest.json

.PHONY: bench
## bench: overhead benchmarks (benchmarks/, pytest-benchmark: end-to-end added time, step
## ratios, scaling, memory, token statistics, planner); writes docs/benchmarks.md. About seven
## minutes on two quiet cores (17 shared with other work); FLOPMETER_E2E_ROUNDS / FLOPMETER_E2E_PAIRS size the end-to-end part.
bench:
	source scripts/_venv.sh && mkdir -p .benchmarks && \
	python -m pytest benchmarks -q -p no:cacheprovider \
	  --benchmark-only --benchmark-json=$(BENCH_JSON) \
	  --benchmark-max-time=0.5 --benchmark-min-rounds=5 --benchmark-columns=min,median,rounds && \
	python benchmarks/write_table.py $(BENCH_JSON) docs/benchmarks.md
