# Set-up and everyday commands. Everything installs into .venv (and, when missing, the
# Debian packages the build needs); nothing relies on what the host happened to have.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# venv support, Python headers and a C compiler: the record scanner is a C extension.
DEBIAN_PACKAGES := python3-venv python3-dev gcc

.PHONY: test run lint bench clean

$(STAMP): pyproject.toml directlog/records/_scan.c
	@$(PYTHON) -c 'import ensurepip, pathlib, sys, sysconfig; \
	  sys.exit(not pathlib.Path(sysconfig.get_paths()["include"], "Python.h").exists())' \
	  2>/dev/null && command -v cc >/dev/null || { \
	  echo "installing $(DEBIAN_PACKAGES) with apt-get"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(DEBIAN_PACKAGES); }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,lint]'
	touch $@

test: $(STAMP)
	$(PY) -m pytest

run: $(STAMP)
	@echo "make run: the broker service arrives with the Kafka protocol server (issue 3);"
	@echo "this tree has the storage engine only. Try 'make test' or 'make bench'."
	@exit 2

lint: $(STAMP)
	$(VENV)/bin/ruff check directlog services tests bench
	$(VENV)/bin/ruff format --check directlog services tests bench
	$(VENV)/bin/mypy directlog services

bench: $(STAMP)
	$(PY) -m bench.storage

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis build *.egg-info
	find directlog -name '*.so' -delete
