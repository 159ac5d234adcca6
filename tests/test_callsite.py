"""Call sites through frameworks: the user's line that made the loader, with
the library's frame second.

A small library installed in a ``site-packages`` folder on PYTHONPATH plays
the frameworks' parts: it re-makes the user's loader with arguments of its
own (as Lightning re-creates a loader and Accelerate's ``prepare`` builds
one), iterates a loader in a thread of its own (MONAI's ThreadDataLoader),
and calls back into the user's code that makes a loader (Lightning's hooks).
The real frameworks run in tests/integration.
"""

import re
import textwrap

from support import cannot_pickle, json_log, line_of, logged, run_script

FAKELIB = '''
import threading
from torch.utils.data import DataLoader


def with_prefetch(loader):
    """Re-make the user's loader, adding an argument of our own."""
    return DataLoader(loader.dataset, batch_size=loader.batch_size,
                      prefetch_factor=2)


def rebuild(loader):
    return with_prefetch(loader)


def call_hook(hook):
    return hook()


def iterate_in_thread(loader):
    out = []
    def work():
        for batch in loader:
            out.append(batch)
    t = threading.Thread(target=work)
    t.start()
    t.join()
    return out
'''


def _install(tmp_path):
    pkg = tmp_path / "site-packages" / "fakelib"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(FAKELIB)
    return str(tmp_path / "site-packages")


def _line_in_lib(text):
    for number, line in enumerate(FAKELIB.splitlines(), 1):
        if text in line:
            return number
    raise AssertionError(text)


def _records(log):
    return json_log(log)


def _run(tmp_path, body, activation=None, start_method=None):
    env = {}
    log = tmp_path / "log.jsonl"
    if activation:
        env["AUTOSAFE_TORCH_LOG_FILE"] = str(log)
    body = "import sys\nsys.path.insert(0, %r)\n" % _install_once(tmp_path) + textwrap.dedent(body)
    return run_script(tmp_path, body, activation=activation, start_method=start_method,
                      env=env), log


def _install_once(tmp_path):
    path = tmp_path / "site-packages"
    return str(path) if path.exists() else _install(tmp_path)


REMADE = """
import torch
from torch.utils.data import DataLoader, TensorDataset
import fakelib
loader = DataLoader(TensorDataset(torch.arange(8.)), batch_size=2)
again = fakelib.rebuild(fakelib.with_prefetch(loader))
digest(again)
"""


def test_loader_remade_by_a_library_names_the_users_line(tmp_path):
    plain, _ = _run(tmp_path, REMADE)
    assert plain.rc != 0 and "prefetch_factor option could only be specified" in plain.stderr
    result, log = _run(tmp_path, REMADE, activation="env")
    assert result.rc == 0 and result.batches, result
    (rec,) = _records(log)
    user = "train.py:%d" % line_of(tmp_path, "loader = DataLoader(")
    via = "fakelib/__init__.py:%d" % _line_in_lib("return DataLoader(loader.dataset")
    assert rec["code"] == "DL101" and rec["call_site"] == "%s (via %s)" % (user, via), rec
    assert rec["cwd"] == str(tmp_path), rec
    # The loader re-made from the re-made one is the same mistake at the same line.
    assert "summary: fixed DL101 x2; JSON log: log.jsonl" in result.stderr, result
    (line,) = logged(result.stderr, "DL101")  # relative, as the user runs it
    assert line.site == rec["call_site"], (line, rec)  # the same on stderr and in the log


def test_loader_made_by_the_users_hook_is_the_users_line_alone(tmp_path):
    body = """
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    import fakelib
    def train_dataloader():
        return DataLoader(TensorDataset(torch.arange(8.)), batch_size=2, prefetch_factor=2)
    digest(fakelib.call_hook(train_dataloader))
    """
    result, log = _run(tmp_path, body, activation="env")
    assert result.rc == 0, result
    (rec,) = _records(log)
    assert rec["call_site"] == "train.py:%d" % line_of(
        tmp_path, "return DataLoader(TensorDataset"), rec


def test_loader_iterated_in_a_library_thread_names_where_it_was_made(tmp_path):
    """Spawn workers and a dataset holding an open file, iterated by the
    library in its own thread: no user frame on that stack at all."""
    body = """
    import os, tempfile, torch
    from torch.utils.data import DataLoader, Dataset
    import fakelib
    class Records(Dataset):
        def __init__(self, path):
            self.file = open(path, "rb")
        def __len__(self):
            return 8
        def __getitem__(self, i):
            self.file.seek(i)
            return torch.tensor(self.file.read(1)[0])
    if __name__ == "__main__":
        path = os.path.join(tempfile.mkdtemp(), "data.bin")
        with open(path, "wb") as f:
            f.write(bytes(range(8)))
        loader = DataLoader(Records(path), batch_size=2, num_workers=2)
        batches = fakelib.iterate_in_thread(loader)
        print("BATCHES", [b.tolist() for b in batches])
    """
    plain, _ = _run(tmp_path, body, start_method="spawn")
    # The library's thread dies with the error; the script gets no batch.
    assert re.search(cannot_pickle("BufferedReader"), plain.output), plain
    assert "BATCHES []" in plain.stdout, plain
    result, log = _run(tmp_path, body, activation="env", start_method="spawn")
    assert result.rc == 0, result
    assert "BATCHES [[0, 1], [2, 3], [4, 5], [6, 7]]" in result.stdout, result
    (rec,) = [r for r in _records(log) if r["code"].startswith("DL") and r["code"] != "DL209"]
    user = "train.py:%d" % line_of(tmp_path, "loader = DataLoader(")
    assert rec["code"] == "DL201" and rec["call_site"].startswith(user + " (via "), rec
    assert "fakelib/__init__.py:%d" % _line_in_lib("for batch in loader") in rec["call_site"]


def test_reading_the_users_frame_keeps_nothing_alive(tmp_path):
    """PyTorch's test_iterable_style_dataset (persistent workers): the user's
    method (a TestCase's) deletes its iterator and waits for the workers to exit. Finding a
    call site must not read that frame's locals: before Python 3.13 the read
    leaves a snapshot on the running frame that keeps the iterator, and its
    workers, alive after ``del``."""
    body = """
import weakref, torch
from torch.utils.data import DataLoader, IterableDataset
class Count(IterableDataset):
    def __iter__(self):
        return iter(range(8))
class Trainer:
  def train(self, epochs):
    loader = DataLoader(Count(), num_workers=2, persistent_workers=True)
    it = iter(loader)
    list(it)
    inner = weakref.ref(getattr(it, "__wrapped__", it))
    workers = list(it._workers)
    other = DataLoader(Count(), num_workers=2, persistent_workers=True)  # sites looked up
    list(iter(other))
    del it, loader
    print("FREED", inner() is None)
    for w in workers:
        w.join(60)
    print("EXITED", not any(w.is_alive() for w in workers))
Trainer().train(1)
"""
    plain, _ = _run(tmp_path, body)
    assert "FREED True" in plain.stdout and "EXITED True" in plain.stdout, plain
    shim, _ = _run(tmp_path, body, activation="env")
    assert "FREED True" in shim.stdout and "EXITED True" in shim.stdout, shim
