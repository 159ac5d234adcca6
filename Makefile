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
