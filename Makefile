# Two commands on a fresh machine (see README): `make run` and `make test`.
# Both create/reuse the virtualenv at .venv and install the library with the versions CI
# tested (constraints/ci.txt). `make test` also creates .venv-peers, where the cross-checks
# against tensorflow-privacy run with that package's own pins (constraints/peers.txt), and
# .venv-beam, where the Apache Beam job runs (constraints/beam.txt; no TensorFlow there).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
PEERS := .venv-peers
PEERS_PY := $(PEERS)/bin/python
PEERS_STAMP := $(PEERS)/.installed-stamp
BEAM := .venv-beam
BEAM_PY := $(BEAM)/bin/python
BEAM_STAMP := $(BEAM)/.installed-stamp

.PHONY: run test test-main test-peers test-beam test-slow lint docs format install bench results clean

$(STAMP): setup.cfg pyproject.toml constraints/ci.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints/ci.txt -e ".[test,lint,docs]"
	$(PY) -m tfdp_embed.ops.build
	$(PY) -m pip check
	touch $(STAMP)

# tfdp_embed is not installed here: the tests import it from this tree (pytest's pythonpath).
$(PEERS_STAMP): constraints/peers.txt
	test -x $(PEERS_PY) || $(PYTHON) -m venv $(PEERS)
	$(PEERS_PY) -m pip install -q --upgrade pip
	$(PEERS_PY) -m pip install -q -r constraints/peers.txt
	PYTHONPATH=. $(PEERS_PY) -m tfdp_embed.ops.build
	$(PEERS_PY) -m pip check
	touch $(PEERS_STAMP)

# Only the Beam job runs here (tfdp_embed_beam, from this tree); the tests that check its output run in .venv.
$(BEAM_STAMP): constraints/beam.txt
	test -x $(BEAM_PY) || $(PYTHON) -m venv $(BEAM)
	$(BEAM_PY) -m pip install -q --upgrade pip
	$(BEAM_PY) -m pip install -q -r constraints/beam.txt
	$(BEAM_PY) -m pip check
	touch $(BEAM_STAMP)

install: $(STAMP)

run: $(STAMP)
	$(PY) -m pipelines.criteo --out saved_models/criteo

# The side environments (.venv-peers, .venv-beam) install while the main suite runs: on CI's 2 cores their
# pip installs overlap the tests instead of following them. Their log is printed if they fail.
test: $(STAMP)
	@$(MAKE) --no-print-directory $(PEERS_STAMP) $(BEAM_STAMP) > .venv-side.log 2>&1 & side=$$!; \
	status=0; $(MAKE) --no-print-directory test-main || status=1; \
	if ! wait $$side; then cat .venv-side.log; echo "creating .venv-peers or .venv-beam failed (log above)"; exit 1; fi; \
	$(MAKE) --no-print-directory test-peers test-beam || status=1; \
	exit $$status

# --dist loadscope: a module's tests share one worker, so a module-scoped fixture (a pipeline run) is built
# once, not once per worker (1896 tests: 862 s against 890 s with the default distribution, 2 cores).
test-main: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadscope --durations=15 tests

# Cross-checks against tensorflow-privacy (ε, σ = 0 weights, the peer step-time benchmark).
test-peers: $(PEERS_STAMP)
	PYTHONPATH=. $(PEERS_PY) -m pytest -q -m peer -p no:cacheprovider tests

# The Beam job (DirectRunner) run from .venv-beam, its shards read and checked by the trainer side in .venv.
test-beam: $(STAMP) $(BEAM_STAMP)
	TFDP_BEAM_PYTHON=$(BEAM_PY) $(PY) -m pytest -q -m beam -p no:cacheprovider tests

# The slow tier (deselected by default): tests marked slow in place and those listed in tests/slow_tier.py.
test-slow: $(STAMP)
	$(PY) -m pytest -q -n 2 --durations=15 -m slow tests

# Every check runs (and reports) even when an earlier one fails; the target fails if any did.
lint: $(STAMP)
	status=0; \
	$(PY) -m ruff check . || status=1; \
	$(PY) -m ruff format --check . || status=1; \
	$(PY) -m mypy || status=1; \
	exit $$status

# The documentation site (mkdocs.yml, docs/) into site/. --strict: every warning fails the build,
# broken internal links and anchors included; external links are not checked (CI has no network).
docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict --quiet

format: $(STAMP)
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

# The peer (tensorflow-privacy's DPKerasSGDOptimizer) runs in .venv-peers, beside its own `none` step.
bench: $(STAMP) $(PEERS_STAMP)
	$(PY) -m benchmarks.step_time --mechanisms none,dense,eana,lazy,lazy_lookahead,fest,adafest --vocab 100000,1000000,10000000 --dim 64 --batch 1024 --steps 30
	PYTHONPATH=. $(PEERS_PY) -m benchmarks.step_time --mechanisms none,tfp_keras_sgd --vocab 100000,1000000,10000000 --dim 64 --batch 1024 --steps 30

# benchmarks/RESULTS.md, written from the JSON under benchmarks/results/ (a test checks it is up to date).
results: $(STAMP)
	$(PY) -m benchmarks.results_page

clean:
	rm -rf $(VENV) $(PEERS) $(BEAM) build site *.egg-info .pytest_cache .ruff_cache .mypy_cache .venv-side.log
