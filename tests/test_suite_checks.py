"""The suite's own checks (tests/conftest.py), run on a small suite of their own:
in CI a skip fails unless its reason is on the named list, and a test that meets
``autosafe_torch: internal error`` fails unless it injects the fault on purpose."""

import re
import shutil
import subprocess
import sys
import textwrap

import pytest

from support import ROOT, clean_env

# The small suite injects an internal error on purpose (test_in_process_internal_error),
# and its report shows that test's stderr, which this process reads.
pytestmark = pytest.mark.internal_error_expected

SUITE = '''
import subprocess, sys
import pytest
from autosafe_torch import report

def test_plain_skip():
    pytest.skip("no such runtime here")

@pytest.mark.skipif(True, reason="needs CUDA")
def test_cuda():
    pass

@pytest.mark.skipif(True, reason="needs Python >= 3.99 (a later feature); this is 3.11")
def test_later_python():
    pass

@pytest.mark.xfail(reason="known", strict=False)
def test_xfail():
    assert False

CHILD = "import sys; sys.stderr.write('autosafe_torch: internal error in X (E: e); ...\\\\n')"

def test_child_internal_error():
    subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True)

@pytest.mark.internal_error_expected
def test_child_internal_error_on_purpose():
    subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True)

def test_in_process_internal_error():
    report.internal_error("a test of the suite", RuntimeError("injected"))

def test_clean_child():
    out = subprocess.run([sys.executable, "-c", "print('internal error, not ours')"],
                         capture_output=True, text=True)
    assert out.returncode == 0
'''


def run_suite(tmp_path, ci):
    shutil.copy(ROOT / "tests" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_small.py").write_text(textwrap.dedent(SUITE))
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nmarkers =\n    internal_error_expected: on purpose\n")
    env = clean_env({"CI": "true"} if ci else {})
    if not ci:
        env.pop("CI", None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p",
                           "no:xdist", "-rA", "-q", str(tmp_path)], cwd=str(tmp_path), env=env,
                          capture_output=True, text=True, timeout=300)
    outcomes = {name: kind for kind, name in re.findall(
        r"^(PASSED|FAILED|XFAIL|ERROR) \S*::(test_\w+)", proc.stdout, re.M)}
    return proc, outcomes


def test_in_ci_only_the_named_skips_pass(tmp_path):
    proc, outcomes = run_suite(tmp_path, ci=True)
    out = proc.stdout
    assert proc.returncode == 1, out
    assert outcomes.get("test_plain_skip") == "FAILED", out
    assert "skipped in CI (CI=true), and not for a reason CI allows: no such runtime here" \
        in out, out
    assert re.search(r"^SKIPPED \[1\] .*: needs CUDA$", out, re.M), out
    assert re.search(r"^SKIPPED \[1\] .*: needs Python >= 3.99", out, re.M), out
    assert outcomes.get("test_xfail") == "XFAIL", out
    assert "skips: 2 (needs CUDA: 1) (needs Python: 1)" in out, out


def test_outside_ci_a_skip_is_a_skip(tmp_path):
    proc, outcomes = run_suite(tmp_path, ci=False)
    out = proc.stdout
    assert re.search(r"^SKIPPED \[1\] .*: no such runtime here$", out, re.M), out
    assert "skips: 3 (needs CUDA: 1) (needs Python: 1) (other: 1)" in out, out


def test_an_internal_error_fails_the_test_that_met_it(tmp_path):
    proc, outcomes = run_suite(tmp_path, ci=False)
    out = proc.stdout
    assert outcomes.get("test_child_internal_error") == "FAILED", out
    assert outcomes.get("test_in_process_internal_error") == "FAILED", out
    assert outcomes.get("test_child_internal_error_on_purpose") == "PASSED", out
    assert outcomes.get("test_clean_child") == "PASSED", out
    assert "the shim failed open (an internal error of ours) in this test" in out, out
    assert "autosafe_torch: internal error in X (E: e)" in out, out
    assert "autosafe_torch: internal error in a test of the suite (RuntimeError: injected)" \
        in out, out
