# The two commands a newcomer needs: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test run lint bench evaluation clean

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,spark]'
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m mypy
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -q; rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected"; exit 0; fi; exit $$rc

run: $(STAMP)
	$(VENV)/bin/pulsarcast devnet --nodes 5 --data-dir data/devnet --api-base-port 8701

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m mypy
	$(VENV)/bin/lint-imports

bench: $(STAMP)
	$(VENV)/bin/pulsarcast bench codec

# The testbed's default scenarios, Pulsarcast against Floodsub, and their QoS report
# (docs/evaluation.md); about 40 minutes on 2 cores.
SCENARIOS := baseline latency churn order
evaluation: $(STAMP)
	for s in $(SCENARIOS); do $(VENV)/bin/pulsarcast testbed run scenarios/$$s.toml --out runs/$$s || exit 1; done
	$(VENV)/bin/pulsarcast report $(addprefix runs/,$(SCENARIOS)) --out docs/evaluation-report

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
