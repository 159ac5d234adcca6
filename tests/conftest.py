import logging
import os
import re
import subprocess
import sys

import pytest

from autosafe_torch import activation, facts, report
from autosafe_torch.config import CONFIG, Config

try:
    import warm  # tests/warm.py: runs forked from a warm interpreter
except ImportError:  # this file copied alone (tests/test_suite_checks.py)
    warm = None


@pytest.fixture(autouse=True)
def _gpu_only_where_marked(request):
    """A test's children see the GPU only when the test is marked gpu (support.clean_env;
    the test modules have imported it by now)."""
    support = sys.modules.get("support")
    if support is None:
        yield
        return
    support.GPU_VISIBLE = request.node.get_closest_marker("gpu") is not None
    yield
    support.GPU_VISIBLE = False


@pytest.fixture(autouse=True)
def _isolate_in_process_state():
    """Tests that call rules or wrappers in this process start clean, and leave
    nothing behind: the configuration, the records, and the patches (a test that
    activates the shim has it taken off again, so that later tests in this
    pytest-xdist worker run unpatched)."""
    saved = Config()
    saved.load(CONFIG)
    was_active = activation.is_active()
    report.clear()
    yield
    if activation.is_active() and not was_active:
        activation.deactivate()
    CONFIG.load(saved)
    facts.override(None)
    report.clear()


# -- In CI, nothing that matters skips ---------------------------------------------------
#
# Under CI=true a test that skips fails, unless the reason it gives begins with one of
# these names: what no step of `make test` can give CI's machine. Everything else a
# test needs, `make test` installs (Makefile: install-test, the test extra and the
# system packages). The skips are listed at the end of every run (-ra).
ALLOWED_SKIPS = {
    "needs CUDA": "a CUDA device: CI's machines have none (`-m gpu` on an accelerator)",
    "needs macOS": "macOS itself, not the rehearsal of it (--as macos)",
    "needs Python": "a Python other than the one running (make compat-python)",
    "needs torch": "a torch version other than the one installed (make compat)",
}


def in_ci():
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def skip_reason(report_):
    """The reason a skipped report gives, without pytest's ``Skipped: ``."""
    longrepr = report_.longrepr
    reason = longrepr[2] if isinstance(longrepr, (tuple, list)) and len(longrepr) == 3 \
        else str(longrepr)
    return reason[len("Skipped: "):] if reason.startswith("Skipped: ") else reason


def allowed_skip(reason):
    """The name of ALLOWED_SKIPS that ``reason`` begins with, or None."""
    return next((name for name in ALLOWED_SKIPS if reason.startswith(name)), None)


def _unexpected_skip(report_):
    """Make a skip outside ALLOWED_SKIPS a failure, under CI."""
    if not (in_ci() and report_.skipped) or hasattr(report_, "wasxfail"):
        return
    reason = skip_reason(report_)
    if allowed_skip(reason):
        return
    where = "%s:%s" % tuple(report_.longrepr[:2]) \
        if isinstance(report_.longrepr, (tuple, list)) else report_.nodeid
    report_.outcome = "failed"
    report_.longrepr = (
        "skipped in CI (CI=%s), and not for a reason CI allows: %s\n  at %s\n"
        "  install what it needs in `make test`'s own steps (Makefile: install-test), or, "
        "where no step can, begin its reason with one of: %s (tests/conftest.py: "
        "ALLOWED_SKIPS)" % (os.environ.get("CI"), reason, where, ", ".join(ALLOWED_SKIPS)))


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """A module that skips as a whole (importorskip, allow_module_level)."""
    outcome = yield
    _unexpected_skip(outcome.get_result())


# -- An internal error of the shim fails the test that met it ------------------------------
#
# "autosafe_torch: internal error in ..." is the shim failing open: the user's call
# ran unchanged, the fix did not happen. A test that meets that line fails, whether
# a child process printed it (its output, as every subprocess of a test returns it
# through Popen.communicate: support.run_script and the direct subprocess.run calls)
# or this process logged it; unless the test injects the fault on purpose and says so
# with @pytest.mark.internal_error_expected.
INTERNAL_ERROR = re.compile(r"^autosafe_torch(\[rank [^\]]*\])?: internal error in .*$", re.M)
_internal_errors = []


def note_internal_errors(*outputs):
    for out in outputs:
        if isinstance(out, bytes):
            out = out.decode("utf-8", "replace")
        if isinstance(out, str) and "internal error" in out:
            _internal_errors.extend(m.group(0) for m in INTERNAL_ERROR.finditer(out))


_communicate = subprocess.Popen.communicate


def _communicate_and_look(self, *args, **kwargs):
    out, err = _communicate(self, *args, **kwargs)
    note_internal_errors(out, err)
    return out, err


class _InternalErrorsHere(logging.Filter):
    """Sees the internal errors logged in this process (it filters nothing out)."""

    def filter(self, record):
        if record.levelno >= logging.ERROR:
            note_internal_errors(record.getMessage())
        return True


def pytest_configure(config):
    subprocess.Popen.communicate = _communicate_and_look
    if warm is not None:
        warm.Server.outputs_seen.append(note_internal_errors)
    report.logger.addFilter(_InternalErrorsHere())


def pytest_runtest_setup(item):
    _internal_errors.clear()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report_ = outcome.get_result()
    _unexpected_skip(report_)
    if report_.when != "call":
        return
    seen = list(_internal_errors)
    _internal_errors.clear()
    if seen and report_.passed and item.get_closest_marker("internal_error_expected") is None:
        report_.outcome = "failed"
        report_.longrepr = (
            "the shim failed open (an internal error of ours) in this test, which injects "
            "no fault (@pytest.mark.internal_error_expected):\n  " + "\n  ".join(seen))


# -- the skips, at the end of the run ------------------------------------------------------

def pytest_terminal_summary(terminalreporter):
    skipped = terminalreporter.stats.get("skipped", [])
    counts = {}
    for rep in skipped:
        name = allowed_skip(skip_reason(rep)) or "other"
        counts[name] = counts.get(name, 0) + 1
    terminalreporter.write_sep("-", "skips: %d%s; allowed in CI: %s" % (
        len(skipped), "".join(" (%s: %d)" % kv for kv in sorted(counts.items())) if counts
        else "", ", ".join(ALLOWED_SKIPS)))
