"""Real programs we did not write (``make realworld``): training code shipped in
packages on PyPI (skorch, transformers, pytorch-metric-learning, MONAI), run offline on
data each test generates, without autosafe_torch on Linux, with it on Linux, and
with it as on macOS. Every test here is marked ``realworld`` (``make test`` skips
them) and skipped when a package its program needs is not installed
(constraints-realworld.txt pins them).

Each test module names its PROGRAM (in programs/), the PACKAGES it needs and
``make_data(folder)``; the fixtures below run the program once per way and module.
"""

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # support.py
sys.path.insert(0, HERE)                   # harness.py

from harness import run  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def _packages_installed(request):
    """Skip when one of the module's PACKAGES is not installed (imported here, at
    run time, so that collecting this folder under ``make test`` stays cheap);
    module-scoped, so that it comes before the module's runs."""
    for name in getattr(request.module, "PACKAGES", ()):
        pytest.importorskip(name)


@pytest.fixture(scope="module")
def data(request, tmp_path_factory):
    """The folder of the module's generated data, where its program runs."""
    folder = tmp_path_factory.mktemp(request.module.__name__)
    request.module.make_data(folder)
    return folder


def _run(request, data, way):
    return run(data, request.module.PROGRAM, way, [data])


@pytest.fixture(scope="module")
def linux(request, data):
    """The plain Linux run (fork, no shim): the reference losses."""
    plain = _run(request, data, "linux")
    assert plain.rc == 0 and plain.losses and len(plain.losses) == request.module.STEPS, plain
    return plain


@pytest.fixture(scope="module")
def linux_shim(request, data):
    return _run(request, data, "linux-shim")


@pytest.fixture(scope="module")
def macos(request, data):
    """Plain Python as on macOS (spawn workers, no shim)."""
    return _run(request, data, "macos")


@pytest.fixture(scope="module")
def macos_shim(request, data):
    return _run(request, data, "macos-shim")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if str(item.fspath).startswith(HERE):
            item.add_marker(pytest.mark.realworld)
