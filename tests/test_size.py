"""At the size people train (issue 41): what the shim reads of a dataset grows with
it only where a hazard needs reading, and then at C speed, whole.

In process: the checks a loader's iterator runs (``dataloader.iter``) over
datasets shaped as real ones are (torchvision's ImageFolder index of
``(path, class)`` tuples, a captions dict, pre-tokenised lists), counting what
they call. A healthy fork loader reads nothing of the dataset: no thread but
the main one, no file open for reading, no CUDA. A hazard is found wherever it
sits, past any sample of a container's first items. End to end, in
``make heavy``: an ImageNet-sized index (1,281,167 tuples), healthy under fork
(nothing recorded, plain torch's batches), and guarded by a lock, as on macOS
(real workers, the hand fix's batches).
"""

import io
import os
import pickle
import threading
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.reduction import ForkingPickler

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from autosafe_torch import facts as facts_mod
from autosafe_torch.engine import run_checks
from autosafe_torch.inspection import inventory, objwalk, probe
from autosafe_torch.remedies import sent_once
from autosafe_torch.remedies.pickling import WorkerPickler
from autosafe_torch.rules import IterContext
from support import json_log, run_script, shim_lines

N = 200_000


class Index(Dataset):
    """An ImageFolder-like index: (path, class) tuples and their targets."""

    def __init__(self, n=N, **held):
        self.samples = [("/data/n%08d/img_%07d.JPEG" % (i % 1000, i), i % 1000)
                        for i in range(n)]
        self.targets = [s[1] for s in self.samples]
        self.__dict__.update(held)

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        return torch.zeros(3), self.samples[i][1]


def checks(dataset, method, platform="linux", cuda=False, collate_fn=None):
    args = {"num_workers": 2, "multiprocessing_context": method, "dataset": dataset,
            "collate_fn": collate_fn, "worker_init_fn": None, "timeout": 0}
    facts = facts_mod.Facts(cpus_usable=8, platform=platform, cuda_initialized=cuda)
    return run_checks("dataloader.iter", args, IterContext(facts, main_guarded=lambda: True))[0]


@pytest.fixture
def counted(monkeypatch):
    """How often the walker, the inventory and the probe are called."""
    calls = {"walk": 0, "take": 0, "probe": 0}

    def counting(name, real):
        def call(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)
        return call

    monkeypatch.setattr(objwalk, "walk", counting("walk", objwalk.walk))
    monkeypatch.setattr(inventory, "take", counting("take", inventory.take))
    monkeypatch.setattr(probe, "probe", counting("probe", probe.probe))
    return calls


HEALTHY = """
import threading
import torch
from torch.utils.data import DataLoader, Dataset
import autosafe_torch
from autosafe_torch.inspection import inventory, objwalk, probe

calls = {"walk": 0, "take": 0, "probe": 0}
def counting(module, name):
    real = getattr(module, name)
    def call(*args, **kwargs):
        calls[name] += 1
        return real(*args, **kwargs)
    setattr(module, name, call)
counting(objwalk, "walk"); counting(inventory, "take"); counting(probe, "probe")

class Index(Dataset):
    def __init__(self, n=200_000):
        self.samples = [("/data/n%08d/img_%07d.JPEG" % (i % 1000, i), i % 1000)
                        for i in range(n)]
    def __len__(self):
        return len(self.samples)
    def __getitem__(self, i):
        return torch.zeros(3), self.samples[i][1]

if __name__ == "__main__":
    loader = DataLoader(Index(), batch_size=64, num_workers=2, shuffle=True)
    for epoch in range(2):
        next(iter(loader))
    print("CALLS", calls, "RECORDS", len(autosafe_torch.interventions()))
"""


def test_a_healthy_fork_loader_reads_nothing_of_its_dataset(tmp_path):
    """In a process of its own (pytest's holds threads and open files): only the
    main thread, no file open for reading, no CUDA, and nothing of the
    dataset is read at its construction or its iterators' starts."""
    result = run_script(tmp_path, HEALTHY, start_method="fork")
    assert result.rc == 0, result
    assert "CALLS {'walk': 0, 'take': 0, 'probe': 0} RECORDS 0" in result.stdout, result


def test_a_live_thread_or_an_open_file_makes_it_look(counted, tmp_path):
    """What the process shows is what makes the checks read the dataset: a pool
    whose threads are alive (DL208 finds it, past any sample), a file open for
    reading (the fork plan names it)."""
    pool = ThreadPoolExecutor(2)
    pool.submit(int).result()  # its threads exist now
    try:
        found = checks(Index(held=[0] * 5000 + [pool]), "fork")
    finally:
        pool.shutdown()
    assert [f.rule.code for f in found] == ["DL208"]
    assert "dataset.held[5000] (a thread pool)" in found[0].done
    path = tmp_path / "rows.bin"
    path.write_bytes(b"x" * 64)
    with open(path, "rb") as f:
        found = checks(Index(held=[0] * 5000 + [f]), "fork")
    assert [f.rule.code for f in found] == ["DL207"]
    assert "dataset.held[5000]: own file offset" in found[0].done


def test_a_hazard_is_found_wherever_it_sits():
    """Spawn: one pass at pickle speed finds what does not pickle at any depth and
    any index, and names it from it back."""
    lock = threading.Lock()
    ds = Index(held=[[i, str(i)] for i in range(20_000)] + [{"guard": lock}])
    result = probe.probe(ds, "dataset")
    assert not result.ok and result.value is lock
    assert result.path == "dataset.held[20000]['guard']"


def test_a_large_plain_container_is_read_in_c_not_entered():
    samples = Index().samples
    edges = []
    real = objwalk.edges

    def counting(obj, items=None):
        edges.append(obj)
        return real(obj, items)

    objwalk.edges, saved = counting, objwalk.edges
    try:
        assert [here for here, _o, _e in objwalk.walk(samples, "samples")] == ["samples"]
    finally:
        objwalk.edges = saved
        objwalk.forget()
    assert len(edges) == 1  # the list itself: none of its 200k tuples
    assert not objwalk.plain([1, 2, [3, threading.Lock()]] * 600)


def test_the_dataset_is_pickled_once_for_every_worker():
    """Spawn: the plan's pickle (or one made at the start) goes to every worker as
    it is, where nothing in it is pickled for one child alone."""
    ds = Index(10)
    loader = DataLoader(ds, num_workers=2, multiprocessing_context="spawn")
    with sent_once.offering(loader):
        first = pickled(ds, WorkerPickler)  # as our workers' start pickles
        second = pickled(ds, WorkerPickler)
        assert pickled(ds, ForkingPickler) != first  # the program's own pickling: as ever
    assert first == second and pickle.loads(first).samples == ds.samples
    assert b"loads" in first  # the dataset travels as its pickle, loaded in the worker
    assert pickled(ds, WorkerPickler) != first  # outside our start: torch's own pickling


@pytest.mark.parametrize("held, why", [
    (torch.ones(3), "a tensor: torch moves it into shared memory for each child"),
    (threading.Lock(), "a lock: it does not pickle (a repair's)"),
])
def test_what_is_pickled_for_one_child_alone_is_not_sent_once(held, why):
    ds = Index(10, held=held)
    loader = DataLoader(ds, num_workers=2, multiprocessing_context="spawn")
    assert sent_once._pickled(loader) is None, why


def test_a_part_that_refers_to_the_dataset_keeps_one_pickle_for_both():
    ds = Index(10)
    loader = DataLoader(ds, num_workers=2, multiprocessing_context="spawn",
                        collate_fn=ds.__getitem__)  # a bound method: its self is the dataset
    assert sent_once._pickled(loader) is None


def pickled(obj, pickler):
    buffer = io.BytesIO()
    pickler(buffer, pickle.DEFAULT_PROTOCOL).dump(obj)
    return buffer.getvalue()


# -- end to end, at ImageNet size (make heavy) -----------------------------------------

IMAGENET = """
import hashlib, os, random, sys, threading, time
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

class Index(Dataset):
    def __init__(self, lazy_lock=False):
        self.samples = [("/data/train/n%08d/img_%07d.JPEG" % (i % 1000, i), i % 1000)
                        for i in range(1_281_167)]
        self.lazy_lock = lazy_lock
        self.cache_lock = None if lazy_lock or not GUARDED else threading.Lock()
    def __setstate__(self, state):  # the hand fix: the lock made where it is used
        self.__dict__.update(state)
        if self.lazy_lock:
            self.cache_lock = threading.Lock()
    def __len__(self):
        return len(self.samples)
    def __getitem__(self, i):
        info = get_worker_info()
        path, label = self.samples[i]
        return torch.tensor([float(label), float(len(path)), float(info.id if info else -1),
                             torch.rand(1).item(), random.random()])

GUARDED = sys.argv[1] != "plain"

if __name__ == "__main__":
    torch.manual_seed(0)
    dataset = Index(lazy_lock=sys.argv[1] == "hand")
    loader = DataLoader(dataset, batch_size=256, sampler=range(0, 1_281_167, 997),
                        num_workers=2)
    model = torch.nn.Linear(5, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    h, t0 = hashlib.sha256(), time.perf_counter()
    for x in loader:
        h.update(x.numpy().tobytes())
        optimizer.zero_grad()
        model(x).square().mean().backward()
        optimizer.step()
    print("BATCHES", h.hexdigest())
"""


@pytest.mark.heavy
def test_an_imagenet_index_under_fork_is_left_alone(tmp_path):
    plain = run_script(tmp_path, IMAGENET, start_method="fork", args=("plain",))
    assert plain.rc == 0, plain
    log = tmp_path / "log.jsonl"
    shim = run_script(tmp_path, IMAGENET, start_method="fork", args=("plain",),
                      activation="env", env={"AUTOSAFE_TORCH_LOG_FILE": str(log)})
    assert shim.rc == 0 and shim.batches == plain.batches, shim
    assert json_log(log) == [] and shim_lines(shim.stderr) == []


@pytest.mark.heavy
@pytest.mark.rule("DL201")
def test_a_lock_guarded_imagenet_index_gets_real_workers_as_on_macos(tmp_path):
    hand = run_script(tmp_path, IMAGENET, start_method="spawn", args=("hand",))
    assert hand.rc == 0, hand
    plain = run_script(tmp_path, IMAGENET, start_method="spawn", args=("guarded",))
    assert plain.rc != 0 and "cannot pickle '_thread.lock'" in plain.stderr, plain
    log = tmp_path / "log.jsonl"
    shim = run_script(tmp_path, IMAGENET, args=("guarded",), activation="env",
                      env={"AUTOSAFE_TORCH_AS": "macos", "AUTOSAFE_TORCH_LOG_FILE": str(log)})
    assert shim.rc == 0 and shim.batches == hand.batches, shim
    (record,) = [r for r in json_log(log) if r["code"] == "DL201"]
    assert record["action"] == "fixed" and "new unlocked locks" in record["strategy"], record
    assert "dataset.cache_lock" in record["done"], record
    assert os.path.exists(log)


PARQUET = """
import hashlib, os, random, sys
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

ROOT = os.path.dirname(os.path.abspath(__file__))

class Features(Dataset):
    # an ImageNet-sized index beside a ParquetFile of features, opened in __init__
    def __init__(self, path, lazy=False):
        self.samples = [("/data/train/n%08d/img_%07d.JPEG" % (i % 1000, i), i % 1000)
                        for i in range(1_281_167)]
        self.path = path
        self.table = None if lazy else pq.ParquetFile(path)
    def __getstate__(self):  # the hand fix: the file opened where it is read
        state = dict(self.__dict__)
        if sys.argv[1] == "hand":
            state["table"] = None
        return state
    def __len__(self):
        return len(self.samples)
    def __getitem__(self, i):
        if self.table is None:
            self.table = pq.ParquetFile(self.path)
        row = self.table.read_row_group(0).column("f")[i % 1000].as_py()
        info = get_worker_info()
        return torch.tensor([float(self.samples[i][1]), row,
                             float(info.id if info else -1), torch.rand(1).item()])

if __name__ == "__main__":
    path = os.path.join(ROOT, "features.parquet")
    pq.write_table(pa.table({"f": [i * 0.5 for i in range(1000)]}), path)
    torch.manual_seed(0)
    loader = DataLoader(Features(path), batch_size=256, sampler=range(0, 1_281_167, 997),
                        num_workers=2)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    h = hashlib.sha256()
    for x in loader:
        h.update(x.numpy().tobytes())
        optimizer.zero_grad()
        model(x).square().mean().backward()
        optimizer.step()
    print("BATCHES", h.hexdigest())
"""


@pytest.mark.heavy
@pytest.mark.rule("DL201")
def test_a_parquet_file_beside_an_imagenet_index_is_rebuilt_as_on_macos(tmp_path):
    """Not refused for its size: each spawn worker builds the dataset again and checks
    its build (the same file read, the same index), the hand fix's batches."""
    hand = run_script(tmp_path, PARQUET, start_method="spawn", args=("hand",))
    assert hand.rc == 0, hand
    plain = run_script(tmp_path, PARQUET, start_method="spawn", args=("plain",))
    assert plain.rc != 0 and "pickle" in plain.stderr, plain
    log = tmp_path / "log.jsonl"
    shim = run_script(tmp_path, PARQUET, args=("plain",), activation="env",
                      env={"AUTOSAFE_TORCH_AS": "macos", "AUTOSAFE_TORCH_LOG_FILE": str(log)})
    assert shim.rc == 0 and shim.batches == hand.batches, shim
    (record,) = [r for r in json_log(log) if r["code"] == "DL201"]
    assert record["action"] == "fixed" and "built" in record["done"], record
