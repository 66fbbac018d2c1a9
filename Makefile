# The two commands of the README: `make demo` runs the demo crawl, `make test` runs the tests.
# Both install what they need first (redis-server from Debian, a virtualenv in .venv).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test bench chaos deps venv clean

deps:
	@command -v redis-server >/dev/null || { \
	  echo "Installing redis-server (Debian package)"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq redis-server >/dev/null; }

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

venv: $(BIN)/python
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'

demo: deps venv
	$(BIN)/python -m scrapy_ha.demo.run

bench: deps venv
	$(BIN)/python bench/run.py

chaos: deps venv
	$(BIN)/python chaos/run.py

test: deps venv
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .demo build *.egg-info
