"""Real programs we did not write (``make realworld``): training code shipped in
packages on PyPI (skorch, transformers, pytorch-metric-learning, MONAI), run offline on
data each test generates, without autosafe_torch on Linux, with it on Linux, and
with it as on macOS. Every test here is marked ``realworld`` (``make test`` skips
them) and skipped when a package its program needs is not installed
(constraints-realworld.txt pins them).
"""

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # support.py
sys.path.insert(0, HERE)                   # harness.py


@pytest.fixture(autouse=True)
def _packages_installed(request):
    """Skip when one of the module's PACKAGES is not installed (imported here, at
    run time, so that collecting this folder under ``make test`` stays cheap)."""
    for name in getattr(request.module, "PACKAGES", ()):
        pytest.importorskip(name)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if str(item.fspath).startswith(HERE):
            item.add_marker(pytest.mark.realworld)
