# The commands of the README: `make demo`, `make test`, `make integration`, `make heavy`,
# `make realworld`.
# torch is pinned in constraints-test.txt for the tests, the demo and the
# benchmarks only (users get a wide range); without the pin pip would fetch
# the newest torch with several GB of CUDA packages.
PYTHON ?= python3
PYTEST_ARGS ?=
# pytest-xdist processes for `make test` and `make heavy` (0: serial). Three on two
# cores for `make test`: many of its tests wait on their children (a hang's timeout,
# a killed parent's orphans, a fork server), and the third keeps the cores busy
# meanwhile. With work stealing (an idle process takes tests from a busy one's
# queue), the suite alone on this 2-core machine, in the working tree: 5:18,
# against 5:53 with two processes and 6:03 with two and no stealing; `make test`
# in a fresh clone, compile step included: 5:43 and 5:43, once 6:05.
# `make heavy` keeps two.
TEST_JOBS ?= 3
HEAVY_JOBS ?= 2
DIST = --dist worksteal
# What `make test` runs; the compat targets run the same.
SUITE = not gpu and not integration and not heavy and not realworld
INSTALL = $(PYTHON) -m pip install -c constraints-test.txt -e
# The system packages the suite needs beyond the test extra (Debian's names):
# PoCL's CPU OpenCL device and the ICD loader, for CV402's tests (tests/test_cv2.py).
# install-test installs them as root on Debian (apt-get update first), and does
# nothing when they are installed; elsewhere it says what to install. Under CI=true
# a test that skips for want of them fails (tests/conftest.py: ALLOWED_SKIPS).
TEST_APT_PACKAGES = pocl-opencl-icd ocl-icd-libopencl1
# The static checks of `make test`, ruff before the suite and mypy beside it
# (configured in pyproject.toml):
# ruff over LINT_PATHS (pyflakes, pycodestyle, bugbear, simplify, pyupgrade and pylint's
# rules, each exception with its reason: [tool.ruff]), then mypy over what its `files`
# name ([tool.mypy]: engine/, rules/, recovery/, remedies/, torch_private, mp_private,
# the records, the rungs and the loader's state; every body checked, the seams' defs
# all annotated), whose annotations it holds to what crosses them.
LINT_PATHS = autosafe_torch tests
# The package's bytecode, written once before a suite: where the environment says
# not to write it (PYTHONDONTWRITEBYTECODE, as on this project's machines), each of
# the suite's processes and their workers would compile the package again (about
# 1.4 s of CPU where the shim loads its rules and recovery).
COMPILE = $(PYTHON) -m compileall -q autosafe_torch
TYPECHECK = $(PYTHON) -m mypy

.PHONY: install-test test heavy demo bench readme integration realworld

install-test:
	@missing=; for p in $(TEST_APT_PACKAGES); do \
	    dpkg -s $$p 2>/dev/null | grep -q '^Status: install ok installed' || missing="$$missing $$p"; \
	done; \
	if [ -z "$$missing" ]; then \
	    :; \
	elif ! command -v apt-get >/dev/null 2>&1; then \
	    echo "install-test: no apt-get here: install a CPU OpenCL runtime (Debian:$$missing) for CV402's tests, which otherwise skip"; \
	elif [ "$$(id -u)" != 0 ]; then \
	    echo "install-test: not root: run 'sudo apt-get update && sudo apt-get install$$missing' for CV402's tests, which otherwise skip"; \
	else \
	    echo "install-test: apt-get install$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi
	$(INSTALL) ".[test]"
	$(COMPILE)

# The type check runs beside the suite, whose processes mostly wait on their
# children (about 10 s of one core, cold); either failing fails the target.
test: install-test
	$(PYTHON) -m ruff check $(LINT_PATHS)
	@$(TYPECHECK) & typecheck=$$!; \
	$(PYTHON) -m pytest -n $(TEST_JOBS) $(DIST) -m "$(SUITE)" $(PYTEST_ARGS); suite=$$?; \
	wait $$typecheck || { echo "make test: mypy failed"; exit 1; }; exit $$suite

# Every scenario under every start method and rehearsed platform: `make test`
# runs each scenario once, the start method rotating (about 6 minutes on 2
# cores; `make test` about 5:45); CI runs this too.
heavy: install-test
	$(PYTHON) -m pytest -n $(HEAVY_JOBS) $(DIST) -m "heavy and not gpu" $(PYTEST_ARGS)

# Real runs through Lightning, Accelerate, MONAI and torchrun (tests/integration/).
# The frameworks are pinned with torch in constraints-integration.txt, which
# also keeps torchvision out (its CUDA build breaks `import lightning` here).
integration:
	$(PYTHON) -m pip install -c constraints-integration.txt -e ".[test]" lightning accelerate monai
	$(COMPILE)
	$(PYTHON) -m pytest -m integration tests/integration $(PYTEST_ARGS)

# Real programs we did not write (tests/realworld/): skorch's NeuralNetClassifier,
# transformers' Trainer, pytorch-metric-learning's trainer with albumentations, MONAI's
# SupervisedTrainer, run offline on data each test generates, without autosafe_torch
# on Linux, with it on Linux (same losses, no fix) and as on macOS (the same losses).
# Pinned with torch in constraints-realworld.txt.
REALWORLD_PACKAGES = skorch transformers tokenizers accelerate pytorch-metric-learning \
	albumentations monai pytorch-ignite

realworld:
	$(PYTHON) -m pip install -c constraints-realworld.txt -e ".[test]" $(REALWORLD_PACKAGES)
	$(COMPILE)
	$(PYTHON) -m pytest -m realworld tests/realworld $(PYTEST_ARGS)

bench:
	$(INSTALL) ".[bench]"
	$(PYTHON) benchmarks/run.py

demo:
	$(INSTALL) ".[demo]"
	$(PYTHON) examples/run_demo.py

# The generated tables (autosafe_torch/readme.py: FILES): configuration in the
# README, rules in docs/rules.md, fix's rewrites in docs/fix.md, the settings
# DL220 carries in docs/how-it-decides.md.
READMES = README.md docs/rules.md docs/fix.md docs/how-it-decides.md

readme:
	$(PYTHON) -m autosafe_torch.readme --write $(READMES)

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
	$(COMPAT_PYTHON) -m pytest -m "$(SUITE)" $(PYTEST_ARGS)

VERSIONS = import sys, torch, numpy; print('Python', sys.version.split()[0], 'torch', torch.__version__, 'numpy', numpy.__version__)

# `make compat-python`: the same suite on CPython 3.9 and 3.13 (pyenv's builds), each in
# its own virtual environment (.venv-py3.9.18, .venv-py3.13.0), built once like `make
# compat`. torch comes from the registry for them (constraints-compat-python.txt: 2.8.0,
# the newest release with wheels for 3.9 as well as 3.13; a CUDA build that runs on the
# CPU; 6.7 GB installed per environment, its nvidia packages downloaded once: pip caches them).
# Both Pythons run even when the first fails; the target fails if either did.
PYENV_VERSIONS ?= $(HOME)/.pyenv/versions
COMPAT_PYTHONS ?= 3.9.18 3.13.0
COMPAT_PYTHON_STAMPS = $(foreach v,$(COMPAT_PYTHONS),.venv-py$(v)/.autosafe-compat-installed)

.PHONY: compat-python compat-torch

.venv-py%/.autosafe-compat-installed: constraints-compat-python.txt pyproject.toml $(wildcard autosafe_torch/_site/*)
	test -x .venv-py$*/bin/python || $(PYENV_VERSIONS)/$*/bin/python -m venv .venv-py$*
	.venv-py$*/bin/python -m pip install -c constraints-compat-python.txt torch numpy
	.venv-py$*/bin/python -m pip install -c constraints-compat-python.txt -e ".[test]"
	touch $@

compat-python: $(COMPAT_PYTHON_STAMPS)
	@failed=; for v in $(COMPAT_PYTHONS); do \
	    .venv-py$$v/bin/python -c "$(VERSIONS)"; \
	    .venv-py$$v/bin/python -m pytest -m "$(SUITE)" $(PYTEST_ARGS) || failed="$$failed $$v"; \
	done; test -z "$$failed" || { echo "compat-python: failed on$$failed"; exit 1; }

# `make compat-torch TORCH=2.14.1`: the suite on another torch release with this
# PYTHON, in .venv-torch<version>, built once (2.14.1 for Python 3.11 lies on this
# machine's disk: about 5.5 GB installed, no download). The version is the pin.
TORCH ?= 2.14.1
COMPAT_TORCH_VENV = .venv-torch$(TORCH)

$(COMPAT_TORCH_VENV)/.autosafe-compat-installed: pyproject.toml $(wildcard autosafe_torch/_site/*)
	test -x $(COMPAT_TORCH_VENV)/bin/python || $(PYTHON) -m venv $(COMPAT_TORCH_VENV)
	$(COMPAT_TORCH_VENV)/bin/python -m pip install "torch==$(TORCH)" numpy
	$(COMPAT_TORCH_VENV)/bin/python -m pip install -e ".[test]" "torch==$(TORCH)"
	touch $@

compat-torch: $(COMPAT_TORCH_VENV)/.autosafe-compat-installed
	$(COMPAT_TORCH_VENV)/bin/python -c "$(VERSIONS)"
	$(COMPAT_TORCH_VENV)/bin/python -m pytest -m "$(SUITE)" $(PYTEST_ARGS)

# `make conformance TEST_DATALOADER=path/to/test_dataloader.py`: PyTorch's own
# DataLoader suite for the installed torch, run without and with autosafe_torch;
# prints every test whose outcome differs, then re-runs each alone with the rules
# it fired disabled (see tests/conformance.py). The file is not in this repository:
# for torch 2.13, cyyever/pytorch at 1e91f44f2d12ab5a9004ea487c92938d3223b731
# (test/test_dataloader.py). About 12 minutes of CPU. Not part of `make test` or CI.
# CONFORMANCE_ARGS: e.g. --disable DL101,DL102,DL103 or --activation sitecustomize,
# and pytest arguments after --.
TEST_DATALOADER ?=
CONFORMANCE_ARGS ?=
CONFORMANCE_DEPS = expecttest psutil pytest-timeout

.PHONY: conformance

conformance:
	@test -n "$(TEST_DATALOADER)" || { echo "usage: make conformance TEST_DATALOADER=path/to/test_dataloader.py"; exit 2; }
	$(INSTALL) ".[test]"
	$(PYTHON) -m pip install -c constraints-test.txt $(CONFORMANCE_DEPS)
	$(PYTHON) tests/conformance.py "$(TEST_DATALOADER)" $(CONFORMANCE_ARGS)

# `make gpu`, on a CUDA machine: the tests marked gpu, then the whole suite with CUDA
# available (as make test selects it, gpu tests included). Each writes every test's
# outcome as it ends (pytest -v) to $(GPU_REPORT_DIR)/gpu-tests.log and suite.log, so a
# run cut short still names what passed and failed; both run, and the target fails if
# either did. Tests not marked gpu keep the GPU from their children (support.clean_env).
# Such a machine may have no network, and a Python with torch (a CUDA build), wrapt, cv2,
# h5py, pytest and pytest-xdist: `make gpu-wheels`, run where the registry is, puts every
# other wheel the tests need (the test extra and the runtime dependencies of pyproject.toml,
# less those, for CPython $(GPU_PYTHON_VERSION) on x86_64) in $(GPU_WHEELS)/; `make gpu`
# installs from there alone, this package too (editable, no build isolation).
GPU_WHEELS ?= gpu-wheels
GPU_PYTHON_VERSION ?= 3.12
GPU_JOBS ?= 8
GPU_REPORT_DIR ?= .
GPU_PREINSTALLED = torch wrapt opencv-python-headless h5py pytest pytest-xdist
GPU_PLATFORMS = manylinux2014_x86_64 manylinux_2_17_x86_64 manylinux_2_28_x86_64 linux_x86_64
# The requirements of pyproject.toml's test extra and runtime, less GPU_PREINSTALLED.
GPU_REQUIREMENTS = import re, sys, tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
	skip = set(sys.argv[1:]); \
	print('\n'.join(r for r in p['dependencies'] + p['optional-dependencies']['test'] \
	                if re.split('[<>=!~ ;\[]', r)[0].lower() not in skip))

.PHONY: gpu gpu-wheels

gpu-wheels:
	rm -rf $(GPU_WHEELS) && mkdir -p $(GPU_WHEELS)
	$(PYTHON) -c "$(GPU_REQUIREMENTS)" $(GPU_PREINSTALLED) > $(GPU_WHEELS)/requirements.txt
	echo editables >> $(GPU_WHEELS)/requirements.txt  # hatchling's editable build needs it
	$(PYTHON) -m pip download -q -d $(GPU_WHEELS) --only-binary=:all: --implementation cp \
	    --python-version $(GPU_PYTHON_VERSION) $(addprefix --platform ,$(GPU_PLATFORMS)) \
	    -r $(GPU_WHEELS)/requirements.txt
	@du -sh $(GPU_WHEELS)

gpu:
	$(PYTHON) -m pip install -q --no-index --find-links $(GPU_WHEELS) -r $(GPU_WHEELS)/requirements.txt
	$(PYTHON) -m pip install -q --no-index --no-build-isolation --no-deps -e .
	$(PYTHON) -c "import torch; assert torch.cuda.is_available(), 'make gpu: no CUDA device here'; \
	    print('make gpu: torch', torch.__version__, 'on', torch.cuda.get_device_name(0))"
	@mkdir -p $(GPU_REPORT_DIR); failed=; \
	$(PYTHON) -m pytest -v --tb=short -m gpu $(PYTEST_ARGS) > $(GPU_REPORT_DIR)/gpu-tests.log 2>&1 \
	    || failed="$$failed gpu-tests"; tail -n 25 $(GPU_REPORT_DIR)/gpu-tests.log; \
	$(PYTHON) -m pytest -v --tb=short -n $(GPU_JOBS) -m "not integration and not heavy and not realworld" \
	    $(PYTEST_ARGS) > $(GPU_REPORT_DIR)/suite.log 2>&1 || failed="$$failed suite"; \
	tail -n 40 $(GPU_REPORT_DIR)/suite.log; \
	test -z "$$failed" || { echo "make gpu: failed:$$failed (logs in $(GPU_REPORT_DIR))"; exit 1; }
