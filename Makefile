# Safedelivr's interface for people and CI: `make run`, `make test`, and the pieces they use.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
UV_VERSION := 0.13.8
STATE := $(or $(SAFEDELIVR_STATE_DIR),$(CURDIR)/.state)
UV := $(STATE)/uv/bin/uv
VENV := $(CURDIR)/.venv
PY := $(VENV)/bin/python
export PYTHON := $(PY)
# Python's bytecode cache stays on even where the shell turns it off: otherwise every test
# worker, every service process a test starts and every tool compiles each project module
# from source again, and pytest rewrites every test module's asserts again in each process.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: help install run test test-unit test-integration env-example openapi docs lint fmt typecheck all services-up \
        services-down services-status migrate topology bench hostile chaos cluster-up cluster-down cluster-test \
        cov cov-decisions mutate clean fuzz simulate

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-16s %s\n", $$1, $$2}'

$(UV):
	@mkdir -p $(STATE)
	$(PYTHON_BOOT) -m venv $(STATE)/uv
	$(STATE)/uv/bin/pip install -q uv==$(UV_VERSION)

PYTHON_BOOT ?= python3

$(VENV)/.synced: pyproject.toml uv.lock | $(UV)
	$(UV) sync --frozen --python $(PYTHON_BOOT)
	@touch $@

install: $(VENV)/.synced ## create .venv with the locked dependencies

run: install services-up ## start everything, migrate, declare topology and run every service
	$(PY) -m services.cli dev

#: Parallel workers of make test: the suite mostly waits on Cassandra, RabbitMQ and timers,
#: so a third worker on the 2-core machine still gains (fresh-clone CIs at bad627d: the
#: parallel phase 10:21 with 2 workers, 9:30 with 3).
TEST_WORKERS ?= 3
#: pytest's "no tests collected" (a PYTEST_ARGS that selects none of one part) is no failure.
OK_IF_NONE = rc=$$?; [ $$rc -eq 0 ] || [ $$rc -eq 5 ] || exit $$rc

test: install services-up ## the whole suite against real RabbitMQ and Cassandra: in parallel workers, then the exclusive tests alone (the slowest 20 listed)
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup -m "not exclusive and not simulated" --durations=20 $(PYTEST_ARGS); $(OK_IF_NONE)
	$(PY) -m pytest -m "exclusive and not simulated" --durations=5 $(PYTEST_ARGS); $(OK_IF_NONE)

test-unit: install ## pure-logic tests only (no services)
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

test-integration: install services-up ## the tests that need RabbitMQ and Cassandra (contracts, integration, browser)
	$(PY) -m pytest tests/contracts tests/integration tests/browser $(PYTEST_ARGS)

openapi: install ## rewrite the committed services/api/openapi.json from the models and the route table, and the client's types from it
	$(PY) -c "import json; from services.api.openapi import document; print(json.dumps(document(), indent=2, sort_keys=True))" > services/api/openapi.json
	$(PY) -m tests.client_types

docs: install ## rewrite the README's provider table from shared/core/catalog.py
	$(PY) -c "from pathlib import Path; from shared.core.catalog import with_table; p = Path('README.md'); p.write_text(with_table(p.read_text()))"

env-example: install ## rewrite .env.example from the settings model and the deploy scripts
	$(PY) -c "from shared.ops.envexample import render; print(render(), end='')" > .env.example

COV_PACKAGES := -m "not offloop" --cov=services --cov=shared --cov-report=
COV_UNIT := $(STATE)/coverage-unit
COV_ALL := $(STATE)/coverage-all

cov: install services-up ## coverage per package: the unit suite alone (bar: 70 % for consumers and webhooks), then the whole suite
	COVERAGE_FILE=$(COV_UNIT) $(PY) -m pytest tests/unit -q $(COV_PACKAGES) $(PYTEST_ARGS)
	COVERAGE_FILE=$(COV_ALL) $(PY) -m pytest -q $(COV_PACKAGES) $(PYTEST_ARGS)
	@echo "== unit tests alone =="
	@$(PY) -m tests.coverage_by_package $(COV_UNIT) 70 services/consumers services/webhooks
	@echo "== the whole suite =="
	@$(PY) -m tests.coverage_by_package $(COV_ALL)

DECISIONS := services.consumers.protocol services.consumers.failover shared.ingest.transitions shared.delivery.precedence

#: Each decision module's own tests: they alone must cover every branch of it.
DECISION_TESTS := tests/unit/consumers/test_protocol.py tests/unit/test_failover.py tests/unit/test_transitions.py tests/unit/test_precedence.py

cov-decisions: install ## branch coverage of the pure decision modules by their own unit tests (CI: must be 100 %)
	$(PY) -m pytest $(DECISION_TESTS) -q -p no:randomly --no-header -m "not offloop" $(addprefix --cov=,$(DECISIONS)) \
		--cov-branch --cov-report=term-missing --cov-fail-under=100

mutate: install ## mutation testing of the decision modules (not in CI; slow)
	rm -rf mutants
	$(VENV)/bin/mutmut run --max-children 2
	$(VENV)/bin/mutmut results
	@$(VENV)/bin/mutmut export-cicd-stats >/dev/null
	@$(PY) -m tests.mutation_score mutants/mutmut-cicd-stats.json 10

lint: install ## ruff format check and lint
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .

fmt: install ## format and autofix
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

typecheck: install ## mypy strict on the packages and the tests (pyproject [tool.mypy])
	$(VENV)/bin/mypy

all: lint typecheck test ## everything CI checks

services-up: install ## install (when missing) and start RabbitMQ and Cassandra
	deploy/local/services.sh up

services-down: ## stop the RabbitMQ and Cassandra that services-up started
	deploy/local/services.sh down

services-status:
	deploy/local/services.sh status

migrate: install ## apply CQL migrations
	$(PY) -m services.cli migrate

topology: install ## declare exchanges, queues and bindings
	$(PY) -m services.cli topology

bench: install services-up ## the benchmark; JSON results in bench/results/
	$(PY) -m bench.run $(BENCH_ARGS)

hostile: install services-up ## parsers at 1x/10x, then hostile input against a stack: loop stalls, peak RSS (last line JSON)
	$(PY) -m bench.hostile.run $(HOSTILE_ARGS)

FUZZ_EXAMPLES ?= 30
FUZZ_SEED ?= 20261125
fuzz: install services-up ## fuzz every API route, both webhook receivers and the tracking endpoint; any 5xx fails (JSON)
	$(PY) -m tests.fuzz.run --examples $(FUZZ_EXAMPLES) --seed $(FUZZ_SEED)

SIM_ARGS := $(if $(SEED),--seed $(SEED)) $(if $(SCHEDULE),--schedule '$(SCHEDULE)') $(if $(SWARM),--swarm $(SWARM)) $(if $(SCENARIOS),--scenarios $(SCENARIOS))
simulate: install ## the delivery path simulated over the twins: every single fault at every step, then a seeded swarm (SEED=n or SCHEDULE=... replays one; SWARM=n; last line JSON)
	$(PY) -m simulation.run $(SIM_ARGS) $(SIMULATE_ARGS)

chaos: install services-up ## fault tests, a soak under faults, the invariants (last line JSON)
	$(PY) -m chaos.run $(CHAOS_ARGS)

cluster-up: install ## start deploy/cluster: 3 Cassandra nodes (127.0.0.1-3, RF 3) and 3 RabbitMQ nodes
	deploy/cluster/cluster.sh up

cluster-down: ## stop the nodes of deploy/cluster
	deploy/cluster/cluster.sh down

cluster-test: cluster-up ## the soak against deploy/cluster, killing one node of each under load (last line JSON)
	set -a && eval "$$(deploy/cluster/cluster.sh env)" && set +a && $(PY) -m chaos.run --cluster $(CHAOS_ARGS)

clean: ## remove the virtualenv (keeps service data in .state)
	rm -rf $(VENV)
