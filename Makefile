# xattn: `make demo` runs the demo, `make test` runs lint + the test suite.
# Works on a fresh machine with only Python 3.11 and make: the first target creates .venv and
# installs the project into it, at the exact versions of constraints.txt (pyproject.toml states
# ranges); pip runs again only when either file is newer than the stamp.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
SAMPLE := samples/hello.wav
PYTEST_ARGS ?=
# pytest's exit status of the last `make test`, for .ci/run (5 = no tests collected)
PYTEST_EXIT := .pytest-exit

.PHONY: all demo test fuzz lint proto install clean-venv constraints compose-check

all: test

$(PY):
	$(PYTHON) -m venv $(VENV)

CONSTRAINTS := constraints.txt

$(STAMP): pyproject.toml $(CONSTRAINTS) | $(PY)
	PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 $(PY) -m pip install -c $(CONSTRAINTS) -e '.[base,test]'
	touch $(STAMP)

# the C++ decoder step (xattn.model.net.fused): built again when its source or its flags
# (model/net/fused.py) change; without a compiler and ninja it is not built and the Python step
# runs (the same results up to float rounding)
FUSED := $(VENV)/.fused
$(FUSED): model/net/csrc/decoder_step.cpp model/net/fused.py $(STAMP)
	$(PY) -m xattn.model.net.fused
	touch $(FUSED)

install: $(STAMP) $(FUSED)

demo: $(STAMP) $(FUSED)
	$(PY) scripts/demo.py $(SAMPLE)

# ruff, and mypy over the package: from the repository root, where xattn/model, xattn/service
# and xattn/clients link to the top-level folders, so every xattn.* import resolves
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) -m mypy -p xattn

test: lint $(FUSED)
	@rm -f $(PYTEST_EXIT)
	$(PY) -m pytest -q --durations=30 $(PYTEST_ARGS) || { rc=$$?; echo $$rc > $(PYTEST_EXIT); exit $$rc; }

# The fuzz tests for longer than CI runs them (tests/test_fuzz.py; counts in the summary).
fuzz: $(STAMP)
	XATTN_FUZZ_EXAMPLES=5000 XATTN_FUZZ_SECONDS=600 $(PY) -m pytest -q tests/test_fuzz.py

# The compose deploy built and run for real: the image (podman or Docker, whichever runs here),
# `compose up`, the demo, the HTTP API, the inspector, `compose down`'s drain, the TLS override
# and the scale profile (deploy/compose_check.sh runs tests/test_compose_stack.py). The first
# build takes a while; later ones reuse its layers.
compose-check: $(STAMP)
	bash deploy/compose_check.sh

proto: $(STAMP)
	$(PY) scripts/gen_proto.py

# Rewrite constraints.txt from the venv (after changing a range in pyproject.toml).
constraints: $(STAMP)
	$(PY) scripts/lock.py

clean-venv:
	rm -rf $(VENV)
