"""Integration tests: real runs through Lightning, Accelerate, MONAI and torchrun.

Every test here is marked ``integration`` (``make integration``; ``make test``
skips them) and skipped when its framework is not installed
(constraints-integration.txt pins them).
"""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(autouse=True)
def _framework_installed(request):
    """Skip when the module's FRAMEWORK is not installed (imported here, at run
    time, so that collecting this folder under ``make test`` stays cheap)."""
    name = getattr(request.module, "FRAMEWORK", None)
    if name:
        pytest.importorskip(name)


def pytest_collection_modifyitems(config, items):
    here = os.path.dirname(os.path.abspath(__file__))
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.integration)
