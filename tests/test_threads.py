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
import threading

import pytest

from support import run_script, venv_with

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
    return venv_with(tmp_path_factory.mktemp("threadlib"), {"threadlib.py": THREADLIB})


def run(tmp_path, python, kind, thread, **kw):
    res = run_script(tmp_path, SCRIPT, python=python, args=(kind,),
                     env={"THREADLIB_THREAD": "1" if thread else "0"}, **kw)
    res.started_by = [l.split()[1] for l in res.stdout.splitlines()
                      if l.startswith("STARTED_BY")]
    return res


@pytest.fixture(scope="module")
def reference(python, tmp_path_factory):
    """The hand-safe dataset under plain spawn, without autosafe_torch."""
    res = run(tmp_path_factory.mktemp("ref"), python, "healthy", True, start_method="spawn")
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
    refused = [l for l in res.stderr.splitlines() if REFUSED in l]
    assert len(refused) == 1 and "plain spawn" in refused[0], res
    assert res.started_by == ["parent"], res
    assert res.batches == reference.batches


def test_control_without_the_thread_the_server_forks_the_workers(tmp_path, python, reference):
    res = run(tmp_path, python, "legacy", False, activation="cli", cli_args=("--as", "macos"))
    assert res.rc == 0 and "DL209 warm-worker-start" in res.stderr, res
    assert "more than one thread" not in res.stderr
    assert res.started_by == ["server"], res
    assert res.batches == reference.batches


# -- the count -------------------------------------------------------------------------

@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/task")
def test_the_count_follows_the_threads_this_process_starts():
    from autosafe_torch.inspection import threads

    before, stop = threads.count(), threading.Event()
    worker = threading.Thread(target=stop.wait)
    worker.start()
    try:
        assert threads.count() == before + 1
        assert not threads.single_threaded()
    finally:
        stop.set()
        worker.join()
    assert threads.count() == before


def test_a_fresh_interpreter_is_single_threaded_until_it_starts_one():
    code = ("import threading; from autosafe_torch.inspection import threads; "
            "a = threads.single_threaded(); e = threading.Event(); "
            "threading.Thread(target=e.wait, daemon=True).start(); "
            "print(a, threads.single_threaded(), threads.count())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ, AUTOSAFE_TORCH="0"))
    assert out.stdout.split() == ["True", "False", "2"], out


def test_a_platform_without_a_count_is_not_single_threaded(monkeypatch):
    from autosafe_torch.inspection import threads

    monkeypatch.setattr(sys, "platform", "sunos5")
    assert threads.count() is None and not threads.single_threaded()
