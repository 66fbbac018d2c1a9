# The two commands of the README: `make demo` runs the demo crawl, `make test` runs the tests.
# Both install what they need first (Debian packages, a virtualenv in .venv pinned by
# constraints.txt). A venv counts only once its stamp (.ready) is written, after the install
# succeeded: a failed one is rebuilt from scratch by the next run.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
READY := $(VENV)/.ready
#: Debian packages of `make demo`: redis-server, and python3-venv for the venvs.
DEMO_PACKAGES := redis-server python3-venv
#: ... and of the tests: nginx-light for the static-site benchmark (and its test), postgresql
#: for the tests of the dead-letter archive (the suite starts its own server), redis-sentinel
#: and openssl for the Sentinel and TLS tests, prometheus for promtool (the alert rules'
#: tests), chromium and chromium-driver for the dashboard's browser test (Playwright drives
#: Debian's chromium: no browser download).
DEBIAN_PACKAGES := $(DEMO_PACKAGES) redis-sentinel openssl nginx-light postgresql \
	prometheus chromium chromium-driver
#: The oldest Scrapy supported (setup.cfg: scrapy>=2.16); CI runs a subset of the suite on it.
OLDEST_SCRAPY := 2.16.*
#: The part of the suite CI runs on the oldest Scrapy: everything that talks to Scrapy's
#: engine in-process, without the long multi-process runs (crash, chaos, demo, bench, scrapyd).
OLDEST_TESTS := tests/test_scheduler_crawl.py tests/test_retry_crawl.py tests/test_retry_classes.py \
	tests/test_codec.py tests/test_config.py tests/test_start_urls.py tests/test_promises.py \
	tests/test_dlq.py tests/test_checkpoints.py tests/test_proxy.py tests/test_useragent.py \
	tests/test_start_stopped.py tests/test_reactor_refused.py

#: What `make lint` holds to the style: ruff on every Python file of the repository that is
#: ours, mypy --strict on the package (it ships py.typed, so its users' checkers read it).
LINT_PATHS := scrapy_ha tests bench chaos example_project docs
TYPED_PACKAGE := scrapy_ha

#: pytest-xdist workers for `make test`: the tests mostly wait on subprocesses and sockets
#: (each worker starts its own redis-server). The suite alone on a 2-core machine, the same
#: 23.2 CPU minutes each time: 22 min 18 s with 2 workers, 16 min 37 s with 3, 14 min 26 s
#: with 4; 3 leaves room for a machine busy with other work. Grown since: 3,444 tests, 34
#: CPU minutes (user and system), 20 min 28 s with 3 workers on a quiet 2-core machine. On a
#: faster one, 3,482 tests took 16 CPU minutes: 13 min 50 s with 3 workers (1.15 cores
#: busy: the tests wait on crawls, kills and timers more than they compute), 11 min 44 s with
#: 4. CI's machine runs nothing else, and took 24.6 and 30.2 minutes with 3: 4 it is.
PYTEST_WORKERS ?= 4
#: `make test` leaves out the long versions of scenarios whose short version it runs.
SHORT := -m 'not long'

.PHONY: demo demo-deps lint test test-long test-bloom test-oldest test-latest test-python test-installed screenshots bench bench-static bench-freshness chaos deps venv constraints clean

# apt_install PACKAGES: install those not installed yet (apt-get update first).
define apt_install
	@missing=""; for p in $(1); do \
	  dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "Installing Debian packages:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; fi
endef

deps:
	$(call apt_install,$(DEBIAN_PACKAGES))

demo-deps:
	$(call apt_install,$(DEMO_PACKAGES))

#: The extras of the test venvs (a variable: a comma inside $(call ...) would split its arguments).
EXTRAS := test,lint

# make_venv DIR, PIP-ARGS: a venv from scratch; its stamp DIR/.ready is written last, so a
# venv whose creation or install failed has none and is removed by the next run.
define make_venv
	rm -rf $(1)
	$(PYTHON) -m venv $(1) || { rm -rf $(1); exit 1; }
	$(1)/bin/pip install -q --upgrade pip
	$(1)/bin/pip install -q $(2)
	touch $(1)/.ready
endef

$(READY): setup.cfg constraints.txt
	$(call make_venv,$(VENV),-c constraints.txt -e '.[$(EXTRAS)]')

venv: $(READY)

demo: demo-deps venv
	$(BIN)/python -m scrapy_ha.demo.run

bench: deps venv
	$(BIN)/python bench/run.py

# The scheduler's own cost: nginx serves the catalogue, so the site is never the limit.
bench-static: deps venv
	$(BIN)/python bench/run.py --site static

bench-freshness: deps venv
	$(BIN)/python bench/freshness.py compare --out bench/results-freshness.json

chaos: deps venv
	$(BIN)/python chaos/run.py

# The style, as CI holds it (.ci/run runs this before the tests); ruff and mypy are pinned in
# constraints.txt, so a new release of either cannot turn CI red on its own.
# Each tool runs even if one before it failed, so that one CI run shows every finding.
lint: venv
	@status=0; \
	$(BIN)/ruff format --check $(LINT_PATHS) || status=1; \
	$(BIN)/ruff check $(LINT_PATHS) || status=1; \
	$(BIN)/mypy --strict $(TYPED_PACKAGE) || status=1; \
	exit $$status

#: The tests' Python processes (pytest's workers, and the crawls, CLI runs and sites they
#: start) share one bytecode cache outside the tree, written even where
#: PYTHONDONTWRITEBYTECODE is set (as on this project's CI machines): without it each of
#: them compiled the package's modules again, and each pytest worker rewrote every test
#: module's asserts (13 s). `tests/test_cli.py tests/test_dlq.py`, five runs alternated on
#: a shared 2-core machine: 34.1 to 41.4 CPU s with it, 39.3 and 47.5 without.
TEST_ENV := PYTHONPYCACHEPREFIX=$(CURDIR)/.pycache PYTHONDONTWRITEBYTECODE=

test: deps venv
	$(TEST_ENV) $(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) $(SHORT) $(PYTEST_ARGS)

# The long versions only (the 10,000-item crash), by hand or nightly.
test-long: deps venv
	$(TEST_ENV) $(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) -m long $(PYTEST_ARGS)

# The dashboard's pictures in the README and docs/dashboard.md, taken by its browser test
# from the pages of a real crawl (docs/img/dashboard-*.png).
screenshots: deps venv
	HA_DOCS_SCREENSHOTS=1 $(BIN)/python -m pytest -q -n 0 tests/test_dashboard_browser.py $(PYTEST_ARGS)

# The kill, shard, failover and conformance suites with a Bloom-filter dupefilter
# (HA_DUPEFILTER = "bloom", grown from its smallest capacity; tests/dupefilter.py).
BLOOM_SUITES = tests/test_crash.py tests/test_shards_crawl.py tests/test_redis_failover.py tests/scrapy_conformance
test-bloom: deps venv
	HA_TEST_DUPEFILTER=bloom $(TEST_ENV) $(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) $(SHORT) $(BLOOM_SUITES) $(PYTEST_ARGS)

# The oldest supported Scrapy, with everything else pinned as in constraints.txt.
.venv-oldest/.ready: setup.cfg constraints.txt
	grep -vi '^scrapy==' constraints.txt > .constraints-oldest.txt
	$(call make_venv,.venv-oldest,-c .constraints-oldest.txt 'scrapy==$(OLDEST_SCRAPY)' -e '.[test]')
	rm -f .constraints-oldest.txt

test-oldest: deps .venv-oldest/.ready
	$(TEST_ENV) .venv-oldest/bin/python -m pytest -q -n $(PYTEST_WORKERS) $(SHORT) $(OLDEST_TESTS) $(PYTEST_ARGS)

# The newest releases of everything, unpinned: run by hand (a new upstream deprecation turns
# into an error here first, under filterwarnings = error).
test-latest: deps
	$(call make_venv,.venv-latest,--upgrade -e '.[$(EXTRAS)]')
	$(TEST_ENV) .venv-latest/bin/python -m pytest -q -n $(PYTEST_WORKERS) $(PYTEST_ARGS)

# The suite on another Python than the venv's (setup.cfg lists 3.11 to 3.13; CI runs the
# machine's python3): `make test-python PYTHON=python3.13`, pinned as `make test` is.
OTHER_VERSION = $(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
OTHER_VENV = .venv-python$(OTHER_VERSION)
test-python:
	@test -n "$(OTHER_VERSION)" || { echo "PYTHON=$(PYTHON): no such Python (give its path)"; exit 2; }
	$(MAKE) deps
	$(call make_venv,$(OTHER_VENV),-c constraints.txt -e '.[test]')
	$(TEST_ENV) $(OTHER_VENV)/bin/python -m pytest -q -n $(PYTEST_WORKERS) $(SHORT) $(PYTEST_ARGS)

# The wheel installed in a clean venv outside the repository (.ci/installed).
test-installed: deps venv
	.ci/installed

# Pin what the suite passes with now (run after `make test-latest` passed).
constraints: venv
	{ echo "# What the test suite is known to pass with (pip freeze of a working venv, minus scrapy-ha)."; \
	  echo "# Regenerate: make constraints. The newest versions: make test-latest."; \
	  $(BIN)/pip freeze --exclude-editable | grep -vi '^scrapy-ha=='; } > constraints.txt

clean:
	rm -rf $(VENV) .venv-oldest .venv-latest .venv-python* .pycache .demo build dist *.egg-info
