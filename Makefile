# The two commands of the README: `make demo` and `make test`.
# torch is pinned for the test environment only (users get a wide range).
PYTHON ?= python3
TORCH_VERSION ?= 2.13.0
PIP = $(PYTHON) -m pip
PYTEST_ARGS ?=

.PHONY: install-test test demo bench readme

install-test:
	$(PIP) install "torch==$(TORCH_VERSION)"
	$(PIP) install -c constraints-test.txt -e ".[test]"

test: install-test
	$(PYTHON) -m pytest -m "not gpu" $(PYTEST_ARGS)

bench:
	$(PIP) install "torch==$(TORCH_VERSION)"
	$(PIP) install -c constraints-test.txt -e ".[cv2]"
	$(PYTHON) benchmarks/run.py

demo:
	$(PIP) install "torch==$(TORCH_VERSION)"
	$(PIP) install -c constraints-test.txt -e .
	$(PYTHON) examples/run_demo.py

readme:
	$(PYTHON) -m autosafe_torch.readme README.md --write

# `make compat`: the test suite on the oldest torch supported (constraints-compat.txt),
# in its own virtual environment, built once: the stamp skips the install on later runs
# (about 3.3 GB: the registry's torch 2.0.1 is the CUDA build; it runs on the CPU).
# Not part of `make test` or CI.
COMPAT_VENV ?= .venv-compat
COMPAT_PYTHON = $(COMPAT_VENV)/bin/python
COMPAT_STAMP = $(COMPAT_VENV)/.autosafe-compat-installed

.PHONY: compat

$(COMPAT_STAMP): constraints-compat.txt pyproject.toml $(wildcard autosafe_torch/_site/*)
	test -x $(COMPAT_PYTHON) || $(PYTHON) -m venv $(COMPAT_VENV)
	$(COMPAT_PYTHON) -m pip install -c constraints-compat.txt torch numpy
	$(COMPAT_PYTHON) -m pip install -c constraints-compat.txt -e ".[test]"
	touch $@

compat: $(COMPAT_STAMP)
	$(COMPAT_PYTHON) -c "import torch, numpy; print('compat: torch', torch.__version__, 'numpy', numpy.__version__)"
	$(COMPAT_PYTHON) -m pytest -m "not gpu" $(PYTEST_ARGS)
