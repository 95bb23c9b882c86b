# The two commands (see README): `make demo` and `make test`. Both install what they need.
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.qpmesh-installed

.PHONY: demo test check lint setup clean

demo: setup
	$(BIN)/qpmesh demo

test: setup lint
	$(BIN)/pytest -q

# the edit loop: lint, types and the fast tests (no namespaces, VMs or slow runs), < 3 min here
check: setup lint
	$(BIN)/pytest -q -m "not netns and not rxe and not slow" -p no:cacheprovider

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

setup: $(STAMP)

$(STAMP): pyproject.toml .ci/setup prober/_fastpath.c prober/_sha256.h prober/_fastbatch.h prober/_fastplan.h
	bash .ci/setup
	touch $@

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
