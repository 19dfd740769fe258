# The two quick-start commands: `make quickstart` and `make test`.
.PHONY: setup quickstart test lint bench

setup:
	bash scripts/setup.sh dev

quickstart: setup
	.venv/bin/trinity run --config examples/quickstart/quickstart.yaml

lint: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .

test: lint
	.venv/bin/python -m pytest -q --timeout=600

bench: setup
	.venv/bin/python benchmarks/bench_throughput.py
