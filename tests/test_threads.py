"""A process forks only while it has one OS thread (inspection/threads.py).

DL209's warm server imports the dataset's installed libraries; one that
starts a thread at import (a telemetry client) leaves the server
multi-threaded, and macOS aborts the children such a process forks. The
library here is installed for real: in the site-packages of a virtual
environment made for the test (support.venv_with), which is what
``warmstart.libraries_for`` asks of a module it preloads. Its dataset holds
a read-only file opened in ``__init__``: DL201 repairs it for spawn, and
DL209 would start its workers warm.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from support import (json_log, logged, once_per_run, result_once_per_run, run_scenario,
                     run_script, venv_with)

THREADLIB = '''
    """An installed library whose import starts a thread (THREADLIB_THREAD=1)."""
    import os
    import threading

    import torch
    from torch.utils.data import Dataset, get_worker_info

    if os.environ.get("THREADLIB_THREAD") == "1":
        threading.Thread(target=threading.Event().wait, daemon=True,
                         name="threadlib telemetry").start()


    class Samples(Dataset):
        """Holds its file open (legacy) or opens it per fetch (hand-safe)."""

        def __init__(self, path, hold_file):
            self.path = path
            self.f = open(path, "rb") if hold_file else None

        def __len__(self):
            return 24

        def __getitem__(self, i):
            f = self.f or open(self.path, "rb")
            f.seek(i * 4)
            raw = f.read(4)
            if self.f is None:
                f.close()
            return {"data": torch.tensor(list(raw)), "torch": torch.randint(1 << 30, ()).item(),
                    "worker": get_worker_info().id, "parent": os.getppid()}
'''

SCRIPT = '''
    import os
    import sys

    import torch
    from torch.utils.data import DataLoader

    from threadlib import Samples

    if __name__ == "__main__":
        path = os.path.abspath("samples.bin")
        with open(path, "wb") as f:
            f.write(bytes(range(256)) * 4)
        torch.manual_seed(0)
        loader = DataLoader(Samples(path, hold_file=sys.argv[1] == "legacy"), batch_size=4,
                            num_workers=2, shuffle=True)
        parents = set()
        h = _hashlib.sha256()
        for epoch in range(2):
            for batch in loader:
                parents.update(batch.pop("parent").tolist())
                h.update(repr({k: v.tolist() for k, v in sorted(batch.items())}).encode())
        print("STARTED_BY", "parent" if parents == {os.getpid()} else "server", flush=True)
        print("BATCHES", h.hexdigest(), flush=True)
'''

REFUSED = "warm server had more than one thread after importing threadlib"


@pytest.fixture(scope="module")
def python(tmp_path_factory):
    """The virtual environment's python (made once in the whole test run)."""
    return Path(once_per_run(tmp_path_factory, "threads-venv", lambda: str(venv_with(
        tmp_path_factory.mktemp("threadlib"), {"threadlib.py": THREADLIB}))))


def run(tmp_path, python, kind, thread, **kw):
    env = dict(kw.pop("env", {}), THREADLIB_THREAD="1" if thread else "0")
    res = run_script(tmp_path, SCRIPT, python=python, args=(kind,), env=env, **kw)
    res.started_by = [line.split()[1] for line in res.stdout.splitlines()
                      if line.startswith("STARTED_BY")]
    return res


@pytest.fixture(scope="module")
def reference(python, tmp_path_factory):
    """The hand-safe dataset under plain spawn, without autosafe_torch (once in the
    whole test run)."""
    res = result_once_per_run(tmp_path_factory, "threads-reference", lambda: run(
        tmp_path_factory.mktemp("ref"), python, "healthy", True, start_method="spawn"))
    assert res.rc == 0 and res.batches and res.started_by == ["parent"], res
    return res


def test_the_library_counts_as_installed(python):
    out = subprocess.run([str(python), "-c", "import threadlib; from autosafe_torch.remedies "
                          "import warmstart; print(warmstart.libraries_for([threadlib.Samples"
                          "('/dev/null', False)]))"], capture_output=True, text=True)
    assert "'threadlib'" in out.stdout, out


def test_the_legacy_dataset_fails_under_spawn_without_autosafe_torch(tmp_path, python):
    res = run(tmp_path, python, "legacy", True, start_method="spawn")
    assert res.rc != 0 and "cannot pickle" in res.stderr, res


def test_a_server_with_a_library_thread_gives_plain_spawn_as_on_macos(tmp_path, python,
                                                                       reference):
    res = run(tmp_path, python, "legacy", True, activation="cli", cli_args=("--as", "macos"))
    assert res.rc == 0, res
    assert "DL201 unpicklable-dataset" in res.stderr and "DL209 warm-worker-start" in res.stderr
    refused = [line for line in res.stderr.splitlines() if REFUSED in line]
    assert len(refused) == 1 and "plain spawn" in refused[0], res
    assert res.started_by == ["parent"], res
    assert res.batches == reference.batches


def test_control_without_the_thread_the_server_forks_the_workers(tmp_path, python, reference):
    res = run(tmp_path, python, "legacy", False, activation="cli", cli_args=("--as", "macos"))
    assert res.rc == 0 and "workers start warm" in res.stderr, res  # DL209's clause
    assert "more than one thread" not in res.stderr
    assert res.started_by == ["server"], res
    assert res.batches == reference.batches


# -- the count -------------------------------------------------------------------------

COUNTING = """
import threading, time
from autosafe_torch.inspection import threads
before, stop = threads.count(), threading.Event()
worker = threading.Thread(target=stop.wait)
worker.start()
during, single = threads.count(), threads.single_threaded()
stop.set()
worker.join()
deadline = time.monotonic() + 30  # join() returns before the OS thread has ended
while threads.count() >= during and time.monotonic() < deadline:
    time.sleep(0.01)
print(threads.single_threaded() if before == 1 else "n/a", before, during, single,
      threads.count())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/task")
def test_the_count_follows_the_threads_a_process_starts():
    """In a fresh interpreter (no test runner's threads): the count rises with a
    thread and falls when it ends; no exact count is assumed."""
    out = subprocess.run([sys.executable, "-c", COUNTING], capture_output=True, text=True,
                         env=dict(os.environ, AUTOSAFE_TORCH="0"), timeout=120)
    single_after, before, during, single_during, after = out.stdout.split()
    assert int(during) > int(before) and single_during == "False", out
    assert int(after) < int(during), out
    if before == "1":
        assert single_after == "True", out


def test_a_fresh_interpreter_is_single_threaded_until_it_starts_one():
    code = ("import threading; from autosafe_torch.inspection import threads; "
            "a = threads.single_threaded(); e = threading.Event(); "
            "threading.Thread(target=e.wait, daemon=True).start(); "
            "print(a, threads.single_threaded(), threads.count())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ, AUTOSAFE_TORCH="0"), timeout=120)
    first, then, count = out.stdout.split()
    assert (first, then) == ("True", "False") and int(count) >= 2, out


def test_a_platform_without_a_count_is_not_single_threaded(monkeypatch):
    from autosafe_torch.inspection import threads

    monkeypatch.setattr(sys, "platform", "sunos5")
    assert threads.count() is None and not threads.single_threaded()


# -- the fork rung, rehearsing macOS ----------------------------------------------------

UNGUARDED = '''
import threading
import torch
from torch.utils.data import DataLoader

if THREAD:
    threading.Thread(target=threading.Event().wait, daemon=True).start()
torch.manual_seed(0)
digest(DataLoader(torch.arange(16.), batch_size=2, num_workers=WORKERS, shuffle=True), epochs=2)
'''


def unguarded(workers, thread):
    return UNGUARDED.replace("WORKERS", str(workers)).replace("THREAD", str(thread))


@pytest.mark.parametrize("thread", [False, True], ids=["one-thread", "two-threads"])
def test_rehearsing_macos_there_is_no_fork_rung(tmp_path, thread):
    """An unguarded main under spawn (DL204) as on macOS: emulated workers, even
    in a process that has one thread now (numpy's BLAS pool kept from
    starting): a library may start one at any time, and a Mac user's script
    was written for spawn."""
    env = {"OPENBLAS_NUM_THREADS": "1"}
    bad = run_script(tmp_path, unguarded(2, thread), start_method="spawn", env=env)
    assert bad.rc != 0 and "bootstrapping phase" in bad.stderr, bad
    log = tmp_path / "log.jsonl"
    res = run_script(tmp_path, unguarded(2, thread), activation="cli",
                     env=dict(env, AUTOSAFE_TORCH_LOG_FILE=str(log)),
                     cli_args=("--as", "macos"))
    ref = run_script(tmp_path, unguarded(0, thread), env=env)
    assert res.rc == 0 and res.batches == ref.batches, res
    records = json_log(log)
    assert [(r["code"], r["strategy"]) for r in records] == [
        ("DL204", "emulated workers (in process)")], records


def test_rehearsing_macos_a_forking_loader_moves_to_spawn_only_with_threads(tmp_path):
    """DL206: the loader asks for fork; macOS aborts the children of a process
    that had a second thread, and leaves those of a single-threaded one alone."""
    body = '''
        import threading
        import torch
        from torch.utils.data import DataLoader

        if __name__ == "__main__":
            if THREAD:
                threading.Thread(target=threading.Event().wait, daemon=True).start()
            torch.manual_seed(0)
            digest(DataLoader(torch.arange(16.), batch_size=2, num_workers=2, shuffle=True,
                              multiprocessing_context="fork"))
    '''
    env = {"OPENBLAS_NUM_THREADS": "1"}
    plain = run_script(tmp_path, body.replace("THREAD", "True"), env=env)
    res = run_script(tmp_path, body.replace("THREAD", "True"), activation="cli", env=env,
                     cli_args=("--as", "macos"))
    assert res.rc == 0 and res.batches == plain.batches, res
    (dl206,) = logged(res.stderr, "DL206")
    assert "more than one thread" in res.stderr and dl206.slug == "fork-on-macos", res
    quiet = run_script(tmp_path, body.replace("THREAD", "False"), activation="cli", env=env,
                       cli_args=("--as", "macos"))
    assert quiet.rc == 0 and quiet.batches == plain.batches, quiet
    assert "DL206" not in quiet.stderr, quiet


# -- Python 3.12+: no fork warning a plain run would not show ---------------------------

FORK_WARNING = "is multi-threaded, use of fork() may lead to deadlocks"
SHOW = {"PYTHONWARNINGS": "always::DeprecationWarning"}  # children inherit it
py312 = pytest.mark.skipif(sys.version_info < (3, 12),
                           reason="needs Python >= 3.12 (it added the multi-threaded fork() "
                           "warning); this is %d.%d" % sys.version_info[:2])


@py312
def test_the_fork_warning_shows_in_these_runs(tmp_path):
    """The control: a process with a second thread that forks shows it here."""
    res = run_script(tmp_path, '''
        import os, threading
        threading.Thread(target=threading.Event().wait, daemon=True).start()
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
    ''', env=SHOW)
    assert res.rc == 0 and FORK_WARNING in res.stderr, res


def _warm(tmp_path, shim):
    return run_scenario(tmp_path, "warmstart/loader.py", activation="env" if shim else None,
                        start_method="spawn", args=("legacy" if shim else "healthy",),
                        env=SHOW)


def _fork_rung(tmp_path, shim):
    from test_workers import loader_script

    return run_script(tmp_path, loader_script("GeneratorDataset()", epochs=2), env=SHOW,
                      start_method="spawn" if shim else "fork",
                      activation="env" if shim else None)


def _recovery(tmp_path, shim):
    return run_scenario(tmp_path, "recovery/scenario.py", activation="env" if shim else None,
                        start_method="fork", args=("kill" if shim else "none", "2"), env=SHOW)


@py312
@pytest.mark.parametrize("case", [_warm, _fork_rung, _recovery],
                         ids=["warm-server", "fork-rung", "recovery"])
def test_no_fork_warning_a_plain_run_would_not_show(tmp_path, case):
    """Each repair against its safe plain run (the hand-safe loader, fork on
    Linux, no fault), every DeprecationWarning shown, in workers and servers too."""
    plain, fixed = case(tmp_path, False), case(tmp_path, True)
    assert plain.rc == 0 and fixed.rc == 0, (plain, fixed)
    assert fixed.batches == plain.batches
    assert FORK_WARNING not in plain.stderr and FORK_WARNING not in fixed.stderr, fixed


@py312
def test_no_fork_warning_from_a_refused_server(tmp_path, python, reference):
    res = run(tmp_path, python, "legacy", True, activation="env", start_method="spawn",
              env=SHOW)
    assert res.rc == 0 and REFUSED in res.stderr, res
    assert FORK_WARNING not in res.stderr and res.batches == reference.batches, res
