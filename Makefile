# Two commands on a fresh machine (see README): `make run` and `make test`.
# Both create/reuse the virtualenv at .venv and install the pinned stack first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: run test test-slow lint format install bench clean

$(STAMP): setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[test,lint]"
	$(PY) -m tfdp_embed.ops.build
	$(PY) -m pip check
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(PY) -m pipelines.criteo --out saved_models/criteo

test: $(STAMP)
	$(PY) -m pytest -q -n 2 --durations=15 tests

# The tests marked slow (deselected by default): dense DP-SGD under tf.distribute.
test-slow: $(STAMP)
	$(PY) -m pytest -q -n 2 --durations=15 -m slow tests

# Every check runs (and reports) even when an earlier one fails; the target fails if any did.
lint: $(STAMP)
	status=0; \
	$(PY) -m ruff check . || status=1; \
	$(PY) -m ruff format --check . || status=1; \
	$(PY) -m mypy || status=1; \
	exit $$status

format: $(STAMP)
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

bench: $(STAMP)
	$(PY) -m benchmarks.step_time --mechanisms none,dense,eana,lazy,lazy_lookahead,fest,adafest,tfp_keras_sgd --vocab 100000,1000000,10000000 --dim 64 --batch 1024 --steps 30

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache .mypy_cache
