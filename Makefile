# Two entry points for a fresh machine: `make demo` and `make test`.
VENV    ?= .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
PYTEST_TIMEOUT ?= 300

.PHONY: demo test bench chaos install clean

$(STAMP): pyproject.toml setup.py constraints.txt $(wildcard scopecast/netio/*.c scopecast/netio/*.h)
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[demo,test,bench]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/scopecast demo

test: $(STAMP)
	$(PY) -m pytest -q --durations=25 --timeout=$(PYTEST_TIMEOUT) tests

bench: $(STAMP)
	$(VENV)/bin/scopecast bench $(if $(HOSTS),-- --hosts $(HOSTS))

chaos: $(STAMP)
	$(PY) -m benchmarks.chaos $(if $(CHAOS_SECONDS),--seconds $(CHAOS_SECONDS))

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
