"""autosafe_torch/mp_private.py, the one place that touches multiprocessing's
private parts, does what the shim needs on every CPython it supports (3.9 to
3.13): tests/mp_private_check.py runs against each interpreter found (this
one always; pyenv's others where installed, else a "needs Python" skip)."""

import os
import pathlib
import subprocess
import sys

import pytest

from support import clean_env

CHECK = pathlib.Path(__file__).resolve().parent / "mp_private_check.py"
SUPPORTED = ("3.9", "3.10", "3.11", "3.12", "3.13")
PYENV = pathlib.Path(os.environ.get("PYENV_ROOT", pathlib.Path.home() / ".pyenv")) / "versions"
EXPECTED = ["ok extra_reducers", "ok context_name", "ok default_start_method",
            "ok forkserver_pid stop_forkserver",
            "ok popen_reading start_through forkserver_process", "ok forkserver_preload",
            "ok inheriting", "ok ProcessObject process_target",
            "ok semlock_of pool_processes pool_running executor_arguments executor_threads "
            "python_rlock rlock_owned locks_inside new_semaphore"]


def _interpreter(version):
    if "%d.%d" % sys.version_info[:2] == version:
        return sys.executable
    found = sorted(PYENV.glob(version + ".*/bin/python"))
    return str(found[-1]) if found else None


@pytest.mark.parametrize("version", SUPPORTED)
def test_each_piece_does_what_the_shim_needs(tmp_path, version):
    python = _interpreter(version)
    if python is None:
        pytest.skip("needs Python %s (pyenv's, under %s)" % (version, PYENV))
    proc = subprocess.run([python, str(CHECK), str(tmp_path)], env=clean_env(), cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:-1] == EXPECTED, proc.stdout
