# Set-up and everyday commands. Everything installs into .venv; nothing relies on the host.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
DATA   ?= ./data

.PHONY: test run lint bench clean

$(STAMP): pyproject.toml
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
	$(VENV)/bin/mypy directlog services

bench: $(STAMP)
	$(PY) -m bench.storage

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
