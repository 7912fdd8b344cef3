# The two commands a newcomer needs: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: evaluation-netns test run lint bench screenshot evaluation sim-evaluation clean

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,spark]'
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m mypy
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -q -rs; rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected"; exit 0; fi; exit $$rc

run: $(STAMP)
	$(VENV)/bin/pulsarcast devnet --nodes 5 --data-dir data/devnet --api-base-port 8701

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m mypy
	$(VENV)/bin/lint-imports

bench: $(STAMP)
	$(VENV)/bin/pulsarcast bench codec

# The picture of the node's web page in docs/ (docs/api.md, "The web page"): a small local
# network, a few events, headless Chromium (apt-get install chromium). About 10 s.
screenshot: $(STAMP)
	$(PY) -m pulsar.tools.screenshot docs/web-page.png

# The testbed's default scenarios, Pulsarcast against Floodsub, and their QoS report
# (docs/evaluation.md); about 40 minutes on 2 cores.
SCENARIOS := baseline latency churn order
evaluation: $(STAMP)
	for s in $(SCENARIOS); do $(VENV)/bin/pulsarcast testbed run scenarios/$$s.toml --out runs/$$s || exit 1; done
	$(VENV)/bin/pulsarcast report $(addprefix runs/,$(SCENARIOS)) --out docs/evaluation-report

# The same four scenarios with every node in its own network namespace and the faults made
# by the kernel; wire bytes from its interface counters (root; docs/testbed.md).
evaluation-netns: $(STAMP)
	for s in $(SCENARIOS); do $(VENV)/bin/pulsarcast testbed run scenarios/$$s.toml --netns --out runs/netns-$$s || exit 1; done
	$(VENV)/bin/pulsarcast report $(addprefix runs/netns-,$(SCENARIOS)) --out docs/evaluation-report-netns

# The simulator at 100, 1,000 and 10,000 nodes (docs/simulator.md, docs/evaluation.md):
# one JSON line per run in docs/sim/results.jsonl, and the scaling plot. About 45 minutes
# on 2 cores. Floodsub sends every event to every subscribed peer it knows (~100-300 per
# node), so it runs fewer events at 1,000 and 10,000 nodes: its figures are per event.
SIM := $(VENV)/bin/pulsarcast sim -q
SIM_OUT := docs/sim/results.jsonl
sim-evaluation: $(STAMP)
	mkdir -p docs/sim && : > $(SIM_OUT)
	for n in 100 1000 10000; do \
	  $(SIM) --nodes $$n --scenario single >> $(SIM_OUT) || exit 1; \
	  $(SIM) --nodes $$n --scenario random >> $(SIM_OUT) || exit 1; \
	  $(SIM) --nodes $$n --scenario churn --loss 0.1 >> $(SIM_OUT) || exit 1; \
	done
	for n in 100 1000; do $(SIM) --nodes $$n --scenario all --events 1 >> $(SIM_OUT) || exit 1; done
	for s in partition offline-author late-subscriber; do \
	  $(SIM) --nodes 1000 --scenario $$s --loss 0.1 >> $(SIM_OUT) || exit 1; done
	$(SIM) --nodes 100 --scenario single --protocol floodsub >> $(SIM_OUT)
	$(SIM) --nodes 1000 --scenario single --protocol floodsub --events 10 >> $(SIM_OUT)
	$(SIM) --nodes 10000 --scenario single --protocol floodsub --events 2 >> $(SIM_OUT)
	$(PY) -m pulsar.tools.sim.plot $(SIM_OUT) docs/sim/scaling-single.png --scenario single

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
