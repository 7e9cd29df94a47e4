# Two commands do all the set-up on a fresh machine:
#   make run    - the main job on the embedded default (sim device, local SQLite MLflow store)
#   make test   - the test suite
# Both create or refresh the local virtual environment (.venv) first; `make docs` builds the documentation site.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test venv bench lint docs clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q -c constraints.txt -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)
	. $(VENV)/bin/activate && ./scripts/main-job

test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

bench: $(STAMP)
	$(PY) -m benchmarks

# The documentation site (mkdocs.yml) into site/; any warning, broken link or missing reference fails it.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

clean:
	rm -rf $(VENV) mlflow.db mlruns .pytest_cache
