# Two set-up commands on a fresh machine:
#   make demo   — venv, install, then the whole loop on embedded defaults (no servers)
#   make test   — venv, install (and the bench's library peers: make peers), start Redis + Kafka on
#                 loopback, build the compose stack's images (podman), run the test suite
# (make test-fast: the tier without services, datasets or slow tests, for the edit-test loop)
#
# VENV can live outside the clone (CI keys it on the dependency files, see .ci/run).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.dinrec-installed

.PHONY: install peers demo test test-fast test-deploy images lint typecheck services-start services-stop bench clean

# TorchRec for the sharded trainer, without its fbgemm-gpu requirement (pyproject.toml: sharded-cpu).
TORCHREC := torchrec==1.9.2
# The library peers of `dinrec bench e2e` (benchmarks/peers): RecTools pins numpy below 2, so they get an
# environment of their own beside this one, which reads this one's site-packages (torch) after its own.
PEERS := $(VENV)-peers
PEERS_STAMP := $(PEERS)/.dinrec-peers-installed
RECTOOLS := rectools[torch]==0.19.0

# gbstats, GrowthBook's statistics engine, is the A/B statistics' reference (tests/reference/gbstats, copied
# unchanged; tests/experiments/test_gbstats_parity.py): its pins (numpy below 2) get an environment of their own.
GBSTATS := $(VENV)-gbstats
GBSTATS_STAMP := $(GBSTATS)/.dinrec-gbstats-installed
GBSTATS_PINS := tests/reference/gbstats/requirements.txt

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# strict: the package is a tree of links under build/ (dinrec.serving -> serving/...), which lint-imports
	# reads; a new module file needs `make install` again (CONTRIBUTING.md)
	$(PY) -m pip install -q -e '.[dev,bench,sharded-cpu]' --config-settings editable_mode=strict
	$(PY) -m pip install -q --no-deps '$(TORCHREC)'
	touch $(STAMP)

install: $(STAMP)

$(PEERS_STAMP): $(STAMP)
	test -x $(PEERS)/bin/python || python3 -m venv $(PEERS)
	$(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' \
	  > "$$($(PEERS)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz-dinrec-venv.pth"
	$(PEERS)/bin/python -m pip install -q '$(RECTOOLS)'
	touch $(PEERS_STAMP)

peers: $(PEERS_STAMP)

$(GBSTATS_STAMP): $(GBSTATS_PINS)
	test -x $(GBSTATS)/bin/python || python3 -m venv $(GBSTATS)
	$(GBSTATS)/bin/python -m pip install -q -r $(GBSTATS_PINS)
	touch $(GBSTATS_STAMP)

demo: $(STAMP)
	$(VENV)/bin/dinrec demo --smoke

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

# mypy over the whole tree: the packages under their dinrec names (the editable install's link tree, put on
# MYPYPATH so the tests' `import dinrec...` reads the same files), the tests and deploy/'s scripts ([tool.mypy]).
typecheck: $(STAMP)
	tree="$$(echo build/__editable__.dinrec-*-py3-none-any)" && \
	  MYPYPATH="$$tree" $(VENV)/bin/mypy "$$tree/dinrec" tests deploy

test: $(STAMP) $(PEERS_STAMP) $(GBSTATS_STAMP)
	$(VENV)/bin/ruff check .
	$(MAKE) typecheck VENV="$(VENV)"
	eval "$$(deploy/local/services.sh start)" && eval "$$(deploy/local/images.sh build)" && \
	  DINREC_REQUIRE_SERVICES=1 $(PY) -m pytest -q $(PYTEST_ARGS)

# The compose stack alone: build its images here (podman, a local Debian base, no registry), run it.
test-deploy: $(STAMP)
	eval "$$(deploy/local/images.sh build)" && \
	  DINREC_REQUIRE_SERVICES=1 $(PY) -m pytest -q -m stack $(PYTEST_ARGS)

images:
	deploy/local/images.sh build

# The fast tier: no services, no datasets, nothing marked slow (CONTRIBUTING.md: test tiers).
test-fast: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(MAKE) typecheck VENV="$(VENV)"
	$(PY) -m pytest -q -m "not redis and not kafka and not data and not slow and not stack" $(PYTEST_ARGS)

services-start:
	deploy/local/services.sh start

services-stop:
	deploy/local/services.sh stop

clean:
	rm -rf build *.egg-info .pytest_cache $(STAMP)  # build/ holds the editable install's link tree
