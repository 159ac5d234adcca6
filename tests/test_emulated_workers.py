"""Emulated workers give the batches of real ones (autosafe_torch/remedies/emulated_workers.py).

The reference is the platform the design calls safe: real fork workers, in
a subprocess, with the start method forced from outside. The scenarios
(tests/scenarios/emulated/scenarios.py) draw from torch, ``random``,
numpy's global state and per-object RNGs, read ``get_worker_info()``, run a
``worker_init_fn``, shard an IterableDataset unevenly, keep persistent
workers over 3 epochs (one left early), use ``batch_size=None`` and a
custom batch sampler with a stateful collate_fn. Each runs with W=2 and W=3
and reports a checksum of every batch and of the parent's random states
after; the emulated run must report the same.
The rest are in-process checks of the mechanism, fast and direct.
"""

import inspect
import io
import re
import sqlite3
import threading
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

from autosafe_torch.remedies.emulated_workers import CopyPlan, EmulatedWorkersIter, SHARE_AT_BYTES
from support import once_per_run, run_script

SCENARIO_DIR = Path(__file__).resolve().parent / "scenarios" / "emulated"
RUN = '''
import sys
sys.path.insert(0, %r)
import scenarios
scenarios.main(sys.argv[1:])
''' % str(SCENARIO_DIR)

SCENARIOS = ("map_aug", "map_generator_drop_last", "per_object_rng", "worker_info",
             "worker_init_fn", "iterable_uneven", "iterable_drop_last", "persistent_map",
             "persistent_iterable", "batch_size_none", "batch_sampler_collate", "isolation",
             "parent_draws")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """``{mode: {(scenario, W): (batches, parent states)}}`` from one run per mode
    (in the whole test run)."""

    def lines(mode):
        res = run_script(tmp_path_factory.mktemp(mode), RUN, start_method="fork", args=(mode,),
                         env={"AUTOSAFE_TORCH": "0"}, timeout=300)
        assert res.rc == 0, res
        found = re.findall(r"^RESULT (\S+) (\d) (\w+) (\w+)$", res.stdout, re.M)
        assert len({(name, w) for name, w, _, _ in found}) == 2 * len(SCENARIOS), res
        return found

    out = {}
    for mode in ("real", "inline"):
        found = once_per_run(tmp_path_factory, "emulated-results-" + mode,
                             lambda mode=mode: lines(mode))
        out[mode] = {(name, int(w)): (batches, states) for name, w, batches, states in found}
    return out


@pytest.mark.parametrize("workers", (2, 3))
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_in_process_emulation_gives_the_batches_of_real_fork_workers(results, scenario, workers):
    real = results["real"][scenario, workers]
    assert results["inline"][scenario, workers] == real


def test_the_worker_count_is_observable_in_the_scenarios(results):
    """Controls: W=2 and W=3 differ, so equal checksums mean something."""
    for scenario in SCENARIOS:
        assert results["real"][scenario, 2][0] != results["real"][scenario, 3][0], scenario


# -- in process ---------------------------------------------------------------


@pytest.fixture(autouse=True)
def _no_rules():
    """The loaders here are built in this process: keep DL104 from clamping them."""
    import autosafe_torch

    autosafe_torch.configure(disable=["*"])


class RandPlusWorkerId(Dataset):
    def __len__(self):
        return 10

    def __getitem__(self, i):
        return torch.rand(1).item() + 10 * get_worker_info().id


def emulated(loader):
    loader._get_iterator = lambda: EmulatedWorkersIter(loader)
    return loader


def test_each_worker_draws_only_from_its_own_stream():
    torch.manual_seed(0)
    loader = emulated(DataLoader(RandPlusWorkerId(), batch_size=None, num_workers=2))
    it = iter(loader)
    streams = [torch.Generator().manual_seed(it._base_seed + w) for w in range(2)]
    expected = [torch.rand(1, generator=streams[i % 2]).item() + 10 * (i % 2) for i in range(10)]
    assert list(it) == expected


def test_parent_states_and_worker_info_are_the_parents_between_batches():
    import random

    import numpy as np

    torch.manual_seed(1)
    random.seed(1)
    np.random.seed(1)
    loader = emulated(DataLoader(RandPlusWorkerId(), batch_size=2, num_workers=2))
    it = iter(loader)  # draws the base seed, as a real iterator does
    before = (torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy())
    for _ in it:
        assert get_worker_info() is None
    assert torch.equal(torch.get_rng_state(), before[0])
    assert random.getstate() == before[1]
    assert (np.random.get_state()[1] == before[2]).all()


def test_len_and_persistent_iterator_reused_by_dataloader():
    loader = emulated(DataLoader(RandPlusWorkerId(), batch_size=3, num_workers=2,
                                 persistent_workers=True))
    first = iter(loader)
    assert len(first) == len(loader) == 4
    assert len(list(first)) == 4
    assert iter(loader) is first  # DataLoader called _reset, as for real workers
    assert len(list(loader)) == 4


@pytest.mark.skipif("in_order" not in inspect.signature(DataLoader).parameters,
                    reason="needs torch >= 2.6: DataLoader(in_order=) is newer than this torch")
def test_in_order_false_gives_the_in_order_sequence():
    def batches(in_order):
        torch.manual_seed(3)
        return [b.tolist() for b in emulated(DataLoader(RandPlusWorkerId(), batch_size=2,
                                                        num_workers=2, in_order=in_order))]

    assert batches(False) == batches(True)


class FailsAt(Dataset):
    def __len__(self):
        return 6

    def __getitem__(self, i):
        if i == 3:
            raise ValueError("bad sample 3")
        return i


def test_a_worker_error_is_raised_at_its_batch_naming_the_worker():
    loader = emulated(DataLoader(FailsAt(), batch_size=None, num_workers=2))
    it = iter(loader)
    assert [next(it) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(ValueError, match=r"(?s)worker 1 \(emulated.*bad sample 3"):
        next(it)


class Counting(IterableDataset):
    def __iter__(self):
        info = get_worker_info()
        return iter(range(info.id * 100, info.id * 100 + 3 + info.id))


def test_a_non_persistent_epoch_ends_and_shuts_its_workers_down():
    loader = emulated(DataLoader(Counting(), batch_size=2, num_workers=2))
    it = iter(loader)
    assert [b.tolist() for b in it] == [[0, 1], [100, 101], [2], [102, 103]]
    assert it._shutdown and it._workers == []


# -- what each worker's copy shares ------------------------------------------------


class Holder:
    def __init__(self, path):
        self.f = open(path, "rb")
        self.f.seek(5)
        self.log = open(Path(path).with_suffix(".log"), "a")
        self.lock = threading.Lock()
        self.small = torch.zeros(4)
        self.big = torch.zeros(SHARE_AT_BYTES // 4)
        self.rng = torch.Generator().manual_seed(1)


def holder_dataset(holder):
    class HolderDataset(Dataset):
        def __len__(self):
            return 2

        def __getitem__(self, i):
            return i

    dataset = HolderDataset()
    dataset.holder = holder
    return dataset


def test_worker_copies_have_their_own_files_and_share_only_what_forked_workers_share(tmp_path):
    """A file read from is opened again for each copy (its own offset), a lock
    is a new one; a log only written and a large tensor are shared, as forked
    workers share them in effect."""
    data = tmp_path / "data.bin"
    data.write_bytes(bytes(range(64)))
    holder = Holder(data)
    plan = CopyPlan(holder)
    a, b = plan.copy(), plan.copy()
    assert a.f is not holder.f and a.f is not b.f
    assert a.f.tell() == 5 and a.f.read(2) == bytes([5, 6]) and b.f.read(1) == bytes([5])
    assert holder.f.tell() == 5
    assert a.log is holder.log and a.big is holder.big
    assert a.lock is not holder.lock and a.lock is not b.lock and not a.lock.locked()
    assert a.small is not holder.small and a.rng is not holder.rng
    assert torch.rand(1, generator=a.rng) == torch.rand(1, generator=b.rng)
    assert {path for path, _type, _why in plan.shared} == {"worker.log", "worker.big"}
    it = EmulatedWorkersIter(DataLoader(holder_dataset(holder), num_workers=2))
    assert {path for path, _type, _why in it.shared} == {"dataset.holder.log",
                                                         "dataset.holder.big"}
    for f in (holder.f, holder.log, a.f, b.f):
        f.close()
    assert isinstance(holder.f, io.BufferedReader)


def test_what_cannot_be_copied_is_refused_never_shared(tmp_path):
    """An in-memory sqlite connection neither pickles nor copies nor reopens:
    the copy is refused, naming it; a file-backed one is reopened read-only."""
    from autosafe_torch.errors import NoExactRung

    (tmp_path / "data.bin").write_bytes(b"x" * 8)
    holder = Holder(tmp_path / "data.bin")
    holder.db = sqlite3.connect(":memory:")
    with pytest.raises(NoExactRung, match=r"worker\.db \(a sqlite connection\)"):
        CopyPlan(holder).copy()
    path = tmp_path / "rows.db"
    with sqlite3.connect(path) as db:
        db.execute("create table t (i integer)")
    holder.db = sqlite3.connect(path)
    copy = CopyPlan(holder).copy()
    assert copy.db is not holder.db
    assert copy.db.execute("select count(*) from t").fetchone() == (0,)


def test_a_generator_is_shared_only_while_no_worker_advances_it():
    """A generator held but never used by the workers is shared (it cannot be
    copied); the first step that advances it is refused, before its batch."""
    from autosafe_torch.errors import NoExactRung

    class Held(Dataset):
        def __init__(self, advance):
            self.pending = (i for i in range(100))
            self.advance = advance

        def __len__(self):
            return 8

        def __getitem__(self, i):
            if self.advance:
                next(self.pending)
            return torch.tensor([i])

    batches = list(EmulatedWorkersIter(DataLoader(Held(False), batch_size=2, num_workers=2)))
    assert torch.cat(batches).view(-1).tolist() == list(range(8))
    with pytest.raises(NoExactRung, match=r"advanced dataset\.pending \(a generator\)"):
        list(EmulatedWorkersIter(DataLoader(Held(True), batch_size=2, num_workers=2)))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (pinning)")
def test_batches_are_pinned_as_torch_pins_them():
    loader = emulated(DataLoader(RandPlusWorkerId(), batch_size=2, num_workers=2,
                                 pin_memory=True))
    assert all(torch.as_tensor(b).is_pinned() for b in loader)


def test_a_torch_generator_is_copied_by_its_state():
    """Each emulated worker's copy of a dataset's ``torch.Generator`` draws what
    a forked worker's would: the same state, its own (reached where the
    generator does not pickle: torch 2.0; the scenario map_aug runs it)."""
    from autosafe_torch.remedies import copies

    gen = torch.Generator().manual_seed(11)
    torch.rand(3, generator=gen)
    twin = copies._torch_generator_copy(gen)
    assert twin is not gen and twin.initial_seed() == gen.initial_seed()
    assert torch.equal(torch.rand(5, generator=twin), torch.rand(5, generator=gen))
    assert copies._torch_generator_copy(object()) is None
