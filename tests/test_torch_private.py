"""What each private piece of torch's DataLoader that ``torch_private`` uses
does: its behaviour, not only its name (``tests/test_torch_seams.py`` is
what happens when a name moves). Run on every pinned torch: ``make test``
(2.13), ``make compat`` (2.0.1), ``make compat-torch`` (2.14.1).

In process, with real forked workers: the adapter's classes are built and
driven as the recovery drives them, with a watch that records its hooks.
"""

import ast
import inspect
import os
import signal
import time

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info
from torch.utils.data._utils.collate import default_collate

from autosafe_torch import torch_private as tp

pytestmark = pytest.mark.skipif(
    "fork" not in __import__("multiprocessing").get_all_start_methods(), reason="needs fork")


class Noisy(Dataset):
    """A sample: its index, the worker that made it, a draw of each generator."""

    def __len__(self):
        return 24

    def __getitem__(self, i):
        info = get_worker_info()
        return torch.tensor([float(i), float(info.id) if info else -1.0,
                             torch.rand(()).item(), float(np.random.randint(1 << 20))])


class Slow(Dataset):
    def __init__(self, stall=None):
        self.stall = stall

    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == self.stall:
            time.sleep(60)
        return torch.tensor(float(i))


class Raising(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 3:
            raise ValueError("sample 3 is bad")
        return torch.tensor(float(i))


class Recorded:
    """A watch that records the hooks ``tp.Watched`` calls."""

    def __init__(self, limit=None, instead=None):
        self.calls = []
        self.recorder = None
        self._limit = limit
        self._instead = instead

    def starting(self):
        self.calls.append(("starting",))

    def limit(self):
        return self._limit

    def observed(self, waited):
        self.calls.append(("observed", waited >= 0))

    def delivered_by(self, worker):
        self.calls.append(("delivered", worker))

    def shut_down(self, workers):
        self.calls.append(("shut_down", len(workers)))

    def failed(self, iterator, exc):
        self.calls.append(("failed", type(exc).__name__))
        return self._instead

    def hung(self, worker, pid, waited):
        self.calls.append(("hung", worker, pid))
        return TimeoutError("hung: worker %s" % worker)


def stop(iterator):
    """Kill the workers (one may sleep in a stall), then let torch shut down.
    torch's own iterator first forgets their pids, as ``Watched`` does: its
    SIGCHLD handler would raise at the kill (torch 2.0 does)."""
    if getattr(iterator, "_worker_pids_set", False):
        from torch.utils.data._utils import signal_handling

        signal_handling._remove_worker_pids(id(iterator))
        iterator._worker_pids_set = False
    for process in tp.worker_processes(iterator):
        process.kill()
    tp.shut_down(iterator)


def loader(dataset, seed=0, **kwargs):
    kwargs.setdefault("batch_size", 2)
    kwargs.setdefault("num_workers", 2)
    return DataLoader(dataset, multiprocessing_context="fork",
                      generator=torch.Generator().manual_seed(seed), **kwargs)


def torch_s(dataset, **kwargs):
    """The batches of torch's own iterator."""
    return [b.tolist() for b in loader(dataset, **kwargs)]


# What a supported torch lacks of what ``Watched`` needs: there, the shim leaves
# the loader to torch's own iterator (unwatched, said once: test_torch_seams).
# None today: torch 2.0's _process_data(data) is watched by _WatchedAtIndex.
WATCHED_GAPS: dict = {}
TORCH = ".".join(torch.__version__.split(".")[:2])


def watchable():
    """Whether this torch has every piece ``Watched`` needs; where it has not,
    that the gap is the one known for it (and nothing more)."""
    missing = tp.watched_missing()
    assert missing == WATCHED_GAPS.get(TORCH, ""), missing
    return not missing


# Where this torch lacks a piece ``Watched`` needs (its known gap, checked above),
# the tests of the watch itself are a named skip, never a silent pass.
needs_watched = pytest.mark.skipif(
    bool(tp.watched_missing()), reason="needs torch >= 2.1: this torch lacks %s for the watch"
    % (tp.watched_missing() or "nothing"))


def test_this_torch_has_every_piece_or_its_known_gap():
    watchable()
    assert tp.emulated_missing() == ""
    assert tp.iterator_class_is_torchs()


def test_what_the_emulated_loop_takes_of_torchs_base_is_checked_on_this_torch():
    """The copy of torch's loop (remedies/emulated_workers.py) reads fields and
    methods of ``_BaseDataLoaderIter`` that it does not set itself: each is one
    ``emulated_missing`` looks for on the running torch."""
    from autosafe_torch.remedies.emulated_workers import EmulatedWorkersIter

    (loop,) = ast.parse(inspect.getsource(EmulatedWorkersIter)).body
    on_self = [n for n in ast.walk(loop) if isinstance(n, ast.Attribute)
               and getattr(n.value, "id", None) == "self" and n.attr[:1] == "_" != n.attr[1:2]]
    its_own = {n.attr for n in on_self if isinstance(n.ctx, ast.Store)} | {
        f.name for f in loop.body if isinstance(f, ast.FunctionDef)}
    of_base = {n.attr for n in ast.walk(loop) if isinstance(n, ast.Attribute)
               and isinstance(n.value, ast.Call) and getattr(n.value.func, "id", None) == "super"
               and n.attr[:1] == "_" != n.attr[1:2]}
    taken = {n.attr for n in on_self} - its_own | of_base
    assert {"_base_seed", "_dataset_kind", "_reset", "_next_index"} <= taken
    assert taken <= set(tp.EMULATED_ATTRIBUTES) | set(tp.EMULATED_METHODS), taken


def test_a_tensors_storage_and_hooks_an_autocasts_state_the_worker_loop():
    """The pieces of torch outside the loader that the shim reads."""
    from torch.utils.data._utils import worker

    a = torch.arange(4.0)
    assert tp.storage_id(a) == tp.storage_id(a[1:]) != tp.storage_id(a.clone())
    leaf = torch.ones(2, requires_grad=True)
    assert not tp.backward_hooks(leaf)
    leaf.register_hook(lambda grad: grad)
    assert tp.backward_hooks(leaf)
    assert tp.autocast_enabled(torch.autocast("cpu", dtype=torch.bfloat16))
    assert not tp.autocast_enabled(torch.autocast("cpu", dtype=torch.bfloat16, enabled=False))
    assert tp.is_worker_loop(worker._worker_loop)
    assert not tp.is_worker_loop(default_collate) and not tp.is_worker_loop(None)
    assert callable(DataLoader.__dict__[tp.GET_ITERATOR])


class ByWorker:
    """torch >= 2.1's shape: ``_process_data`` is passed the worker."""

    def _process_data(self, data, worker_idx):
        return data

    def _try_put_index(self):
        pass


class AtIndex:
    """torch 2.0's shape: ``_process_data(data)`` advances ``_rcvd_idx`` itself,
    ``_try_put_index`` records each index's worker in ``_task_info``."""

    def _process_data(self, data):
        self._rcvd_idx += 1
        return data

    def _try_put_index(self):
        self._task_info[self._send_idx] = (0,)
        self._send_idx += 1


class Neither(AtIndex):
    """One argument, but the index is advanced elsewhere: no worker to be read."""

    def _process_data(self, data):
        return data


def test_the_delivery_shape_picks_the_watched_variant_of_this_torch():
    assert tp.delivery_shape(ByWorker) == "worker"
    assert tp.delivery_shape(AtIndex) == "index"
    assert tp.delivery_shape(Neither) is None
    assert tp.delivery_shape(object) is None
    params = list(inspect.signature(tp.MultiProcessIter._process_data).parameters)
    expected = "worker" if "worker_idx" in params else "index"  # 2.0: (self, data)
    assert tp.delivery_shape(tp.MultiProcessIter) == expected
    assert tp.Watched._process_data.__code__.co_argcount == len(params)
    assert issubclass(tp.Watched, tp.MultiProcessIter)


class Stalled(Dataset):
    """Index 0 comes late: worker 1's batch arrives first and waits in torch's
    ``_task_info`` until index 0's is delivered."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 0:
            time.sleep(0.5)
        return torch.tensor([float(i), float(get_worker_info().id)])


class Uneven(IterableDataset):
    """Worker 0 ends its stream first: torch skips the indices it sent there."""

    def __iter__(self):
        info = get_worker_info()
        return (torch.tensor(i) for i in range(info.id * 100, info.id * 100 + 2 + 3 * info.id))


@needs_watched
@pytest.mark.parametrize("dataset,worker_of", [
    (Stalled, lambda b: int(b[0][1])),  # an early batch kept, delivered after index 0's
    (Uneven, lambda b: int(b) // 100),  # a worker's end: the indices it had are skipped
], ids=["out-of-order", "stream-ended"])
def test_delivered_by_names_the_worker_of_each_batch_as_it_is_yielded(dataset, worker_of):
    kwargs = {"batch_size": 1} if dataset is Stalled else {"batch_size": None}
    expected = torch_s(dataset(), **kwargs)
    watch = Recorded()
    batches = list(tp.Watched(loader(dataset(), **kwargs), watch))
    assert [b.tolist() for b in batches] == expected
    assert [c[1] for c in watch.calls if c[0] == "delivered"] == [worker_of(b) for b in batches]


@needs_watched
def test_watched_gives_torch_s_batches_and_calls_each_hook_in_order():
    expected = torch_s(Noisy())
    watch = Recorded()
    it = tp.Watched(loader(Noisy()), watch)
    assert [b.tolist() for b in it] == expected  # the same seeds, workers and order
    kinds = [c[0] for c in watch.calls]
    assert kinds[0] == "starting" and kinds[-1] == "shut_down"
    # _process_data: once per batch, round robin over the workers (torch >= 2.1
    # passes the worker; on 2.0, _WatchedAtIndex reads it from the index sent)
    assert [c[1] for c in watch.calls if c[0] == "delivered"] == [0, 1] * 6
    assert kinds.count("observed") == 12  # _get_data: once per batch received
    assert ("shut_down", 2) in watch.calls
    assert watch.recorder is not None and len(watch.recorder.drawn) == 12  # the sampler's


@needs_watched
def test_a_resumed_iterator_gives_the_rest_of_the_same_run():
    """The same base seed and the recorded indices, the first batches fetched
    again (``fetch_next``) and dropped: the rest is the uninterrupted run's."""
    expected = torch_s(Noisy())
    ds = loader(Noisy())
    watch = Recorded()
    first = tp.Watched(ds, watch)
    taken = [next(first).tolist() for _ in range(3)]
    resume = tp.Resume(tp.base_seed(first), watch.recorder)
    assert tp.batches_sent(first) >= 3
    tp.shut_down(first)
    second = tp.Watched(ds, watch, resume)
    for _ in range(3):
        tp.fetch_next(second)
    tp.set_yielded(second, 3)
    assert taken + [b.tolist() for b in second] == expected
    assert second._num_yielded == len(expected)  # set_yielded counts as __next__ does


@needs_watched
def test_a_killed_worker_is_the_watch_s_not_torch_s_sigchld_handler():
    """Out of torch's SIGCHLD table, a death raises nothing in the main thread
    (torch's handler would, wherever it is); the next wait hands the error to
    ``watch.failed``, and ``dead_workers`` names the worker."""
    watch = Recorded(instead=LookupError("recovered"))
    it = tp.Watched(loader(Slow(stall=2), batch_size=1), watch)
    assert next(it).tolist() == [0.0]
    victim = tp.worker_processes(it)[0]
    os.kill(victim.pid, signal.SIGKILL)
    victim.join(10)
    time.sleep(0.3)  # torch's handler would have raised here
    with pytest.raises(LookupError, match="recovered"):
        for _ in range(8):
            next(it)
    assert [w for w, _p in tp.dead_workers(it)] == [0]
    assert ("failed", "RuntimeError") in watch.calls
    stop(it)


@needs_watched
def test_a_silence_beyond_the_limit_goes_to_watch_hung_with_the_awaited_worker():
    watch = Recorded(limit=1.0)
    it = tp.Watched(loader(Slow(stall=0), batch_size=1), watch)
    with pytest.raises(TimeoutError, match="hung: worker 0"):
        next(it)
    (hung,) = [c for c in watch.calls if c[0] == "hung"]
    assert hung[1] == 0 and hung[2] == tp.worker_processes(it)[0].pid
    assert tp.awaited_worker(it) == 0
    stop(it)


def test_torch_s_own_words():
    # A worker's error names its worker: the words worker_named_in reads.
    it = iter(loader(Raising(), batch_size=1))
    with pytest.raises(ValueError) as raised:
        list(it)
    assert tp.worker_named_in(str(raised.value)) == 1  # index 3 goes to worker 1
    stop(it)
    # The user's timeout: torch's message is TIMED_OUT's.
    it = iter(loader(Slow(stall=0), batch_size=1, timeout=0.5))
    with pytest.raises(RuntimeError) as raised:
        next(it)
    assert str(raised.value) == tp.TIMED_OUT % 0.5
    stop(it)  # the stalled worker would hold torch's shutdown 5 s
    source = inspect.getsource(tp.MultiProcessIter._get_data)
    assert tp.PIN_THREAD_EXITED in source
    init_consts = tp.BaseIter.__init__.__code__.co_consts
    assert tp.warns_pin_memory_without_accelerator() == any(
        isinstance(c, str) and tp.PIN_MEMORY_WARNING in c for c in init_consts)


def test_worker_info_is_what_get_worker_info_returns():
    info = tp.WorkerInfo(id=1, num_workers=2, seed=5, dataset=None)
    assert get_worker_info() is None
    tp.set_worker_info(info)
    try:
        assert get_worker_info() is info
        assert tp.current_worker_info() is info
        batch = [torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0])]
        assert torch.equal(tp.collate_in_process(batch), default_collate(batch))
        assert get_worker_info() is info  # put back after the in-process collate
    finally:
        tp.set_worker_info(None)


class Seeds(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        info = get_worker_info()
        return torch.tensor([info.id, info.seed - info.id, np.random.randint(1 << 30)],
                            dtype=torch.int64)


def test_worker_seeds_are_base_seed_plus_id_and_numpy_s_is_generate_state():
    for worker, base, drawn in [b[0].tolist() for b in loader(Seeds(), batch_size=1)][:2]:
        np.random.seed(tp.numpy_seed(base, worker))
        assert np.random.randint(1 << 30) == drawn
    assert tp.has_numpy()


class Stream(IterableDataset):
    def __iter__(self):
        info = get_worker_info()
        return iter(range(info.id * 100, info.id * 100 + 3))


def test_fetchers():
    fetcher = tp.create_fetcher(tp.DatasetKind.Map, Noisy(), True, default_collate, False)
    assert fetcher.fetch([0, 1]).shape == (2, 4)
    assert not tp.is_iterable_kind(tp.DatasetKind.Map)
    assert tp.is_iterable_kind(tp.DatasetKind.Iterable)
    assert tp.IterableStop(3).worker_id == 3


@needs_watched
def test_the_end_of_an_iterable_dataset_is_no_death():
    # Workers that ended their IterableDataset and exited cleanly are not dead.
    it = tp.Watched(loader(Stream(), batch_size=None), Recorded())
    assert sorted(int(b) for b in it) == [0, 1, 2, 100, 101, 102]
    for process in tp.worker_processes(it):
        process.join(10)
    assert tp.dead_workers(it) == []


@needs_watched
def test_next_epoch_is_a_persistent_loader_s_next_epoch():
    """``next_epoch`` (torch's ``_reset``) on a kept iterator: the same workers
    go on, their random states carried over, as DataLoader's own reuse does."""
    kept = loader(Noisy(), persistent_workers=True)
    expected = [[b.tolist() for b in kept] for _ in range(2)]
    same = loader(Noisy(), persistent_workers=True)
    it = tp.Watched(same, Recorded())
    first = [b.tolist() for b in it]
    tp.next_epoch(it, same)
    assert [first, [b.tolist() for b in it]] == expected
    tp.shut_down(it)


def test_storages_keep_their_python_object_is_what_torch_does():
    import weakref

    t = torch.ones(3)
    kept = t.untyped_storage() is t.untyped_storage()
    assert tp.storages_keep_their_python_object() == kept
    if kept:  # then a weak reference to a storage is safe: it goes when the storage goes
        cache = weakref.WeakValueDictionary(s=torch.ones(3).untyped_storage())
        assert len(cache) == 0
