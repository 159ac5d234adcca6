"""Never run with a hazard left in place (issue 19): files isolated by
descriptor under fork, one check for deciding and acting, inspection that
survives any object, and the real causes of a worker's failure.

The scenario (tests/scenarios/held_files.py) holds one file opened in
``__init__`` through each wrapper people use: a ZipFile, a TarFile, a
GzipFile, a bz2 or lzma file, numpy's NpzFile, a text file with
``newline=''`` on CRLF lines, a user's ``__getattr__`` delegator, and an
IterableDataset that shards with ``get_worker_info()``. Its safe twin opens
the file in the process that reads it. Each case, under fork, spawn as on
macOS (no fork rung) and forkserver as on Linux from Python 3.14: the plain
run fails (an error, or other batches than the twin's), the shimmed run
gives the twin's batches, and the record names the rung; or, where no rung
is exact (a CRLF text file as on macOS), a clear error and a record that
says the fix did not hold.
"""

import json

import numpy as np
import pytest

from autosafe_torch.engine import run_checks
from autosafe_torch.inspection import descriptors, holdings, probe, tensors
from autosafe_torch.remedies import isolation
from autosafe_torch.rules import IterContext
from support import json_log, once_per_run, rotated, run_scenario, run_script

KINDS = ("zip", "tar", "gzip", "bz2", "lzma", "npz", "text-crlf", "delegator", "iterable")
# What spawn can send by path with the same bytes and state (a TarFile's state
# is its file and its member list; the delegator's and the stream's, a plain
# file). The rest (a decompressor, a ZipFile's lock, a newline mode) cannot be.
BY_PATH = ("tar", "delegator", "iterable")
# As on macOS (no fork rung), the others are built again in each worker from
# their constructor's arguments (a path and a kind): real workers, with the
# file as construction left it (a text file whose newline mode cannot be read
# back, which emulated workers could not copy, too).
REBUILT_RUNG = "repair: build the dataset again in each worker"
PLATFORMS = {"fork": "linux", "spawn": "macos", "forkserver": "linux-py314"}
FORK, BY_PATH_RUNG = "start method: fork", "repair: reopen read-only files by path in each worker"
BY_PATH_AND_FORWARDER_RUNG = ("repair: reopen read-only files by path and rebuild attribute "
                              "forwarders in each worker")
EMULATED = "emulated workers (in process)"

def twin(tmp_path_factory, kind):
    """The safe twin's batches (fork, no shim): the known-safe run (once in the
    whole test run)."""

    def batches():
        tmp = tmp_path_factory.mktemp("twin")
        result = run_scenario(tmp, "held_files.py", args=(kind, "twin"), start_method="fork")
        assert result.rc == 0 and result.batches, result
        return result.batches

    return once_per_run(tmp_path_factory, "held-files-twin-" + kind, batches)


def shimmed(tmp_path, kind, method, name="log"):
    """(Result, records) of the legacy dataset under the shim, as on ``method``'s platform."""
    log = tmp_path / ("%s.jsonl" % name)
    env = {"AUTOSAFE_TORCH_LOG_FILE": str(log), "AUTOSAFE_TORCH_AS": PLATFORMS[method]}
    result = run_scenario(tmp_path, "held_files.py", args=(kind, "held"), activation="env",
                          start_method="fork" if method == "fork" else None, env=env)
    records = json_log(log)
    return result, records


def expected_rungs(kind, method):
    """The (code, strategy) records of a run that ends with the twin's batches."""
    if method == "fork":
        return {("DL207", "own offset in each worker")}
    if kind in BY_PATH:
        # The delegator's unpickling would recurse in its __getattr__ in the
        # worker: DL201 rebuilds it from its attributes, and the workers stay real.
        rungs = {("DL201", BY_PATH_AND_FORWARDER_RUNG if kind == "delegator" else BY_PATH_RUNG)}
        if method == "spawn":
            rungs.add(("DL209", "warm forkserver"))
        return rungs
    if method == "spawn":  # macOS: no fork rung
        return {("DL201", REBUILT_RUNG), ("DL209", "warm forkserver")}
    return {("DL201", FORK), ("DL207", "own offset in each worker")}


@pytest.mark.parametrize("kind, method", rotated(KINDS))
def test_held_file_runs_with_the_safe_twins_batches(tmp_path, tmp_path_factory, kind, method):
    safe = twin(tmp_path_factory, kind)
    plain = run_scenario(tmp_path, "held_files.py", args=(kind, "held"), start_method=method)
    if method == "fork":  # shared offsets: an error, or other records (a race: three tries)
        for _ in range(2):
            if plain.rc != 0 or plain.batches != safe:
                break
            plain = run_scenario(tmp_path, "held_files.py", args=(kind, "held"),
                                 start_method="fork")
        assert plain.rc != 0 or plain.batches != safe, plain
    else:
        assert plain.rc != 0 and "cannot pickle" in plain.stderr, plain
    result, records = shimmed(tmp_path, kind, method)
    assert result.rc == 0 and result.batches == safe, result
    assert {(r["code"], r["strategy"]) for r in records} == expected_rungs(kind, method)
    assert "internal error" not in result.stderr, result
    if kind == "delegator" and method != "fork":
        (repair,) = [r for r in records if r["code"] == "DL201"]
        assert "dataset.held (a Delegator) rebuilt from its attributes" in repair["done"]


@pytest.mark.heavy
@pytest.mark.parametrize("kind", KINDS)
def test_fork_cases_five_times(tmp_path, tmp_path_factory, kind):
    """Races are not deterministic: five more shimmed fork runs, each exact,
    and the plain run shows the hazard in at least one of five."""
    safe = twin(tmp_path_factory, kind)
    plain = [run_scenario(tmp_path, "held_files.py", args=(kind, "held"), start_method="fork")
             for _ in range(5)]
    assert any(p.rc != 0 or p.batches != safe for p in plain), plain
    for attempt in range(5):
        result, records = shimmed(tmp_path, kind, "fork", name="log%d" % attempt)
        assert result.rc == 0 and result.batches == safe, result
        assert {r["code"] for r in records} == {"DL207"}


def test_writable_files_stay_shared_and_the_record_says_so(tmp_path):
    """A dataset that appends to a log it opened in __init__ and reads its
    data file: under fork the data file gets its own offset in each worker,
    the log stays shared (every worker appends to it, as without the shim)."""
    body = """
import os, torch
from torch.utils.data import DataLoader, Dataset
class Logged(Dataset):
    def __init__(self):
        with open("data.bin", "wb") as f:
            f.write(bytes(range(256)) * 64)
        self.data = open("data.bin", "rb")
        self.log = open("fetches.log", "a")
    def __len__(self):
        return 16
    def __getitem__(self, i):
        self.data.seek(i * 1000)
        self.log.write("%d\\n" % i)
        self.log.flush()
        return torch.tensor(list(self.data.read(4)))
if __name__ == "__main__":
    digest(DataLoader(Logged(), batch_size=4, num_workers=2))
"""
    reference = run_script(tmp_path, body.replace("num_workers=2", "num_workers=0"))
    log = tmp_path / "log.jsonl"
    result = run_script(tmp_path, body, start_method="fork", activation="env",
                        env={"AUTOSAFE_TORCH_LOG_FILE": str(log)})
    assert result.rc == 0 and result.batches == reference.batches, result
    assert sorted(map(int, (tmp_path / "fetches.log").read_text().split())) == \
        sorted(list(range(16)) * 2)  # the reference's 16 and the workers' 16, all appended
    (record,) = json_log(log)
    assert record["code"] == "DL207"
    assert "dataset.data (fd" in record["why"] and "own offset" in record["why"]
    assert "left shared, open for writing: dataset.log" in record["why"]


REMEDY_FAILS_IN_WORKERS = """
import os, sys, torch
from torch.utils.data import DataLoader, Dataset
from autosafe_torch.remedies import isolation

PARENT, reopen_description = os.getpid(), isolation.reopen_description

def vanished_in_workers(fd, dev, ino, flags):
    # The file cannot be reopened in the workers (as when its path is gone on
    # macOS): the parent's check passed, the worker's act fails.
    if os.getpid() != PARENT:
        raise OSError(2, "No such file or directory")
    return reopen_description(fd, dev, ino, flags)

isolation.reopen_description = vanished_in_workers

class Records(Dataset):
    def __init__(self, lazy):
        with open("data.bin", "wb") as f:
            f.write(bytes(range(256)) * 64)
        self.f = None if lazy else open("data.bin", "rb")
    def __len__(self):
        return 16
    def __getitem__(self, i):
        if self.f is None:  # the safe twin: opened in the process that reads
            self.f = open("data.bin", "rb")
        self.f.seek(i * 1000)
        return torch.tensor(list(self.f.read(4))) + torch.rand(1)

if __name__ == "__main__":
    torch.manual_seed(0)
    digest(DataLoader(Records("twin" in sys.argv), batch_size=4, num_workers=2))
"""


@pytest.mark.rule("DL216")
def test_a_repair_a_worker_cannot_apply_steps_down(tmp_path):
    """Decided in the parent, failed in the workers: never run on with the
    offset shared. Recovery resumes on emulated workers (DL216), with the
    batches of two correct workers; with DL216 off, the user reads why."""
    twin = run_script(tmp_path, REMEDY_FAILS_IN_WORKERS, start_method="fork", args=["twin"])
    assert twin.rc == 0 and twin.batches, twin
    log = tmp_path / "log.jsonl"
    result = run_script(tmp_path, REMEDY_FAILS_IN_WORKERS, start_method="fork",
                        activation="env", env={"AUTOSAFE_TORCH_LOG_FILE": str(log)})
    assert result.rc == 0 and result.batches == twin.batches, result
    records = {r["code"]: r for r in map(json.loads, log.read_text().splitlines())}
    assert set(records) == {"DL207", "DL216"}
    assert records["DL216"]["strategy"] == EMULATED
    assert "could not be given its own offset" in records["DL216"]["why"]
    # What was planned did not hold, and its record says so: never "fixed".
    assert records["DL207"]["action"] == "failed"
    assert records["DL207"]["done"].startswith("did not hold: "), records["DL207"]
    assert "did not hold DL207 x1" in result.stderr
    off = run_script(tmp_path, REMEDY_FAILS_IN_WORKERS, start_method="fork", activation="env",
                     env={"AUTOSAFE_TORCH_DISABLE": "DL216"})
    assert off.rc != 0 and "RemedyFailed" in off.stderr, off
    assert "could not be given its own offset in worker" in off.stderr


# -- inspection that survives any object ---------------------------------------------


class Holder:
    def __init__(self, **attrs):
        self.__dict__.update(attrs)


class Recursing:
    """A ``__getattr__`` delegator whose target is not set yet: every attribute
    it does not have recurses (as unpickling such an object does)."""

    def __getattr__(self, name):
        return getattr(self.inner, name)


class AnswersPickle:
    """A ``__getattr__`` that raises AttributeError for what it does not hold (as
    transformers' tokenizers do): it unpickles as it is, no forwarder to rebuild."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        if name.startswith("__") or "inner" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.__dict__["inner"], name)


def test_a_forwarder_is_one_whose_unpickling_would_fail():
    import pickle

    from autosafe_torch.inspection.holdings import forwards_attributes

    recursing, answering = Recursing(), AnswersPickle([1, 2])
    recursing.inner = [1, 2]
    with pytest.raises(RecursionError):
        pickle.loads(pickle.dumps(recursing))
    assert forwards_attributes(recursing)
    assert pickle.loads(pickle.dumps(answering)).inner == [1, 2]
    assert not forwards_attributes(answering)


class LazyModule:
    """A lazy-module proxy: touching any attribute imports (counted here)."""

    touched = 0

    def __getattribute__(self, name):
        type(self).touched += 1
        raise ImportError("lazy import of %s" % name)


class ClassRaises:
    @property
    def __class__(self):
        raise RuntimeError("no class for you")


class ReduceRaises:
    def __reduce_ex__(self, protocol):
        raise RuntimeError("no pickle for you")


def test_inspection_survives_any_object(tmp_path):
    """numpy's NpzFile (its .f raises on __class__), a recursing delegator, a
    lazy-module proxy, an object whose __class__ raises and one whose
    __reduce_ex__ raises, beside a plain file: every look goes on past them,
    finds the file, and touches none of them."""
    np.savez(tmp_path / "a.npz", x=np.arange(3))
    (tmp_path / "d.bin").write_bytes(b"1234")
    with np.load(tmp_path / "a.npz") as npz, open(tmp_path / "d.bin", "rb") as f:
        odd = [npz, Recursing(), LazyModule(), ClassRaises(), ReduceRaises()]
        ds = Holder(odd=odd, f=f, more={"odd": odd[3]})
        assert sorted(p for p, *_ in holdings.find_files(ds)) == [
            "dataset.f", "dataset.odd[0].fid", "dataset.odd[0].zip.fp"]  # one file, twice
        found = isolation.plan({"dataset": ds})
        paths = sorted(d.path for d in found.isolate)  # each descriptor once
        assert paths[0] == "dataset.f" and paths[1] in ("dataset.odd[0].fid",
                                                        "dataset.odd[0].zip.fp"), paths
        assert len(paths) == 2 and not found.unhandled
        assert [d.fd for d in descriptors.find_descriptors({"dataset": ds})] == \
            [d.fd for d in found.isolate]
        assert holdings.fork_blockers(ds) == []
        assert tensors.scan(ds).found == []
        result = probe.probe(ds)
        assert not result.ok and result.path.startswith("dataset.")
        assert LazyModule.touched == 0


def _iter_plan(dataset, method, platform="linux"):
    from autosafe_torch import facts

    args = {"num_workers": 2, "multiprocessing_context": method, "dataset": dataset,
            "collate_fn": None, "worker_init_fn": None, "timeout": 0}
    ctx = IterContext(facts.Facts(cpus_usable=8, platform=platform), main_guarded=lambda: True)
    return run_checks("dataloader.iter", args, ctx)[0]


def test_one_check_for_deciding_and_acting(tmp_path):
    """The fork rung is chosen, or kept, only where its remedies handle every
    object found, by the functions they act with: an lmdb environment (which a
    forked child must not use) held in a tuple cannot be replaced in a forked
    worker, so a fork loader goes to spawn (where it travels by path), and a
    spawn loader that must leave spawn is not sent to fork (emulated workers).
    A lock nobody holds is no obstacle to fork; one another thread holds now is.
    (An h5py file needs nothing under fork: its descriptor is privatized at the
    kernel. A lock this thread holds as it starts the workers is not looked for:
    with no other thread alive nothing of the dataset is read, and a worker that
    waits on it is a hang the watchdog recovers, DL211.)"""
    import threading

    import lmdb

    path = str(tmp_path / "rows.lmdb")
    with lmdb.open(path, map_size=1 << 20) as env, env.begin(write=True) as txn:
        txn.put(b"0", b"row")
    env = lmdb.open(path, readonly=True, lock=False)
    try:
        in_tuple = Holder(handles=(env,))
        found = _iter_plan(in_tuple, "fork")
        # Spawn would need it sent by path, a repair decided before DL207: emulated.
        assert [(f.rule.code, f.strategy) for f in found] == [("DL212", EMULATED)]
        assert "item of a tuple" in found[0].why
        unpicklable = Holder(handles=(env,), gen=(x for x in ()))
        found = _iter_plan(unpicklable, "spawn")  # not to fork: the tuple again
        assert (found[0].rule.code, found[0].strategy) == ("DL201", EMULATED)
        in_attribute = Holder(env=env)  # replaceable: reopened in each forked worker
        assert [(f.rule.code, f.strategy) for f in _iter_plan(in_attribute, "fork")] == [
            ("DL212", "reopen in each worker")]
    finally:
        env.close()

    unheld = Holder(lock=threading.Lock(), gen=(x for x in ()))
    found = _iter_plan(unheld, "spawn")
    assert (found[0].rule.code, found[0].strategy) == ("DL201", FORK)
    taken, release = threading.Event(), threading.Event()

    def hold():
        with unheld.lock:
            taken.set()
            release.wait()

    holder = threading.Thread(target=hold)
    holder.start()
    taken.wait()
    try:
        found = _iter_plan(unheld, "spawn")
    finally:
        release.set()
        holder.join()
    assert (found[0].rule.code, found[0].strategy) == ("DL201", EMULATED)
