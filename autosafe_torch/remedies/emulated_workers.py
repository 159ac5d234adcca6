"""Faithful emulated DataLoader workers: the in-process rung.

The copy of torch's loop, and so an adapter, as ``torch_private.py`` is (the
one other module that uses torch's private names). It mirrors torch 2.13.0's
``_MultiProcessingDataLoaderIter`` (``_reset``, ``_next_data``,
``_try_put_index``, ``_process_data``; its queues are ``_pending``) and
``_worker_loop`` (``EmulatedWorker``), on the ``_BaseDataLoaderIter`` of every
torch supported (``torch_private.emulated_missing`` checks each field read
here). A torch whose loop changes is compared with this copy, and the version
above moves. Behaviour tests: ``tests/test_emulated_workers.py``.

Where W worker processes cannot be started, torch's fallbacks change the
batches (``num_workers=0`` seeds no worker, threads share every random
state). ``EmulatedWorkersIter`` yields, in this process, exactly the batches
of W workers on a safe platform (Linux, fork, the same seed): the main
process's side ported step for step (the sampler called at the same moments,
so one drawing from the global RNG draws the same), and each worker as
``_worker_loop`` builds it (its seeds, ``WorkerInfo``, ``worker_init_fn``
once, fetcher, its own copy of the parts, ``copies.py``, and of every file
description, ``Descriptions``), swapped in around each of its steps. Every
step runs in the caller's thread when its result is needed, so the caller's
code never runs while a worker's state is in: exact, as fetching ahead on a
thread would not be. Tasks run in the order sent and results are taken in
task order: what ``in_order=True`` makes of every timing (an exhausted
IterableDataset worker only stops receiving tasks); with ``in_order=False``,
the order of equally fast workers (map-style: the in-order one).

Not emulated: process-global state outside the parts (module globals, class
attributes, cv2's RNG), which forked workers copy and emulated ones share (a
``worker_init_fn`` that reaches the dataset through a global, not
``get_worker_info().dataset``, changes the parent's);
``torch.set_num_threads(1)`` beyond the worker's steps (the caller's
training step keeps its threads); ``timeout`` and ``multiprocessing_context``.
"""

import collections
import contextlib
import functools
import itertools
import os
import random
import threading

import torch

from .. import torch_private as tp
from ..errors import NoExactRung
from ..inspection.descriptors import open_files
from ..inspection.parts import PARTS
from . import generators, isolation
from .copies import SHARE_AT_BYTES, CopyPlan, positions

__all__ = ["EmulatedWorkersIter", "EmulatedWorker", "SWAP_LOCK", "NoExactRung", "SHARE_AT_BYTES"]

# Held by every step that swaps the global random states or the worker info, and
# by ours that must see the parent's (the sampler, the base seed): two loaders
# iterated on two threads do not swap states under each other.
SWAP_LOCK = threading.RLock()

_SKIPPED = object()  # a task sent to a worker whose IterableDataset had ended


# -- the kernel's part of a worker's copy ------------------------------------------

class Descriptions:
    """What DL207 gives a forked worker, for whoever holds a descriptor (a raw
    ``os.open()`` int, a C library): its own description, at the offset when
    the iterator started, swapped in under the same number around each of its
    steps. ``shared``: files that can no longer be reopened, left as they are."""

    def __init__(self, workers):
        self.shared = []
        self.parked = {}
        self.own: list[dict[int, int]] = [{} for _ in range(workers)]
        try:
            for found in [f for f in open_files() if f.private]:
                try:
                    copies = [isolation.private_copy(found) for _ in range(workers)]
                except OSError as exc:
                    self.shared.append((found.describe(), "descriptor",
                                        "cannot be reopened (%s)" % isolation.reason(exc)))
                    continue
                self.parked[found.fd] = (isolation.park(found.fd), os.get_inheritable(found.fd))
                for own, fd in zip(self.own, copies):
                    own[found.fd] = fd
        except BaseException:
            self.close()
            raise

    def enter(self, worker_id):
        for fd, own in self.own[worker_id].items():
            os.dup2(own, fd, inheritable=self.parked[fd][1])

    def leave(self):
        for fd, (parked, inheritable) in self.parked.items():
            os.dup2(parked, fd, inheritable=inheritable)

    def close(self):
        for fd in [p for p, _ in self.parked.values()] + [
                fd for own in self.own for fd in own.values()]:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.parked, self.own = {}, []


# -- one emulated worker --------------------------------------------------------

class EmulatedWorker:
    """One worker of ``_worker_loop``, run step by step in this process: its
    random states live here between steps; ``active`` swaps them (and its
    ``WorkerInfo``) in around each step, under ``SWAP_LOCK``."""

    def __init__(self, worker_id, num_workers, base_seed, kind, objects, auto_collation,
                 drop_last, shared_seed, descriptions, watched):
        self.id = worker_id
        self._descriptions = descriptions
        self._watched = watched
        self.seed = base_seed + worker_id
        self._base_seed = base_seed
        self._kind = kind
        self.dataset, self.collate_fn, self.init_fn = objects
        self._auto_collation = auto_collation
        self._drop_last = drop_last
        self._states = None  # seeded on the first step
        self._shared_rng = torch.Generator()
        self._seed_datapipe(shared_seed)
        self.info = tp.WorkerInfo(id=worker_id, num_workers=num_workers, seed=self.seed,
                                 dataset=self.dataset)
        self.fetcher = None
        self.init_exception = None
        self.iteration_end = False

    @contextlib.contextmanager
    def active(self):
        with SWAP_LOCK:
            parent_states = generators.capture()
            parent_info = tp.current_worker_info()
            # One intra-op thread, as _worker_loop sets: what the dataset sees
            # in torch.get_num_threads(), and no OpenMP team contending with
            # the caller's (10x slower fetches measured on a busy 2-core box).
            parent_threads = torch.get_num_threads()
            if parent_threads != 1:
                torch.set_num_threads(1)
            try:
                if self._states is None:  # _worker_loop's seeding, but the parent's
                    random.seed(self.seed)  # CUDA generators are not the worker's to seed
                    torch.default_generator.manual_seed(self.seed)
                    if tp.has_numpy():  # imported if torch can: a real worker seeds it even unused
                        import numpy  # noqa: PLC0415 - optional dependency

                        numpy.random.seed(tp.numpy_seed(self._base_seed, self.id))
                else:
                    generators.restore(self._states)
                tp.set_worker_info(self.info)
                self._descriptions.enter(self.id)
                before = positions(self._watched)
                yield
            finally:
                self._descriptions.leave()
                self._states = generators.capture()
                tp.set_worker_info(parent_info)
                generators.restore(parent_states)
                if parent_threads != 1:
                    torch.set_num_threads(parent_threads)
            for (_gen, path), was, now in zip(self._watched, before, positions(self._watched)):
                if now != was:
                    raise NoExactRung("emulated worker %d advanced %s (a generator), which the "
                                      "emulated workers share: each forked worker would have "
                                      "advanced its own" % (self.id, path))

    def _seed_datapipe(self, shared_seed):
        if isinstance(self.dataset, tp.ITER_DATAPIPE):
            self._shared_rng.manual_seed(shared_seed)
            self.dataset = torch.utils.data.graph_settings.apply_random_seed(
                self.dataset, self._shared_rng)

    def _new_fetcher(self):
        return tp.create_fetcher(
            self._kind, self.dataset, self._auto_collation, self.collate_fn, self._drop_last)

    def start(self):
        """Seeding, ``worker_init_fn(id)`` and the fetcher, as the worker starts."""
        with self.active():
            try:
                if self.init_fn is not None:
                    self.init_fn(self.id)
                self.fetcher = self._new_fetcher()
            except Exception:
                self.init_exception = self._wrap_exception()

    def resume(self, shared_seed):
        """A persistent worker's ``_ResumeIteration``: a new fetcher, same states."""
        with self.active():
            self.iteration_end = False
            self._seed_datapipe(shared_seed)
            self.fetcher = self._new_fetcher()

    def run(self, index):
        """The data for one task, or ``_SKIPPED`` once the IterableDataset ended."""
        if self.iteration_end:
            return _SKIPPED
        with self.active():
            if self.init_exception is not None:
                data, self.init_exception = self.init_exception, None
                return data
            try:
                if self.fetcher is None:
                    raise RuntimeError("the worker's fetcher was not created")
                return self.fetcher.fetch(index)
            except StopIteration:
                if not tp.is_iterable_kind(self._kind):
                    return self._wrap_exception()
                self.iteration_end = True
                return tp.IterableStop(self.id)
            except Exception:
                return self._wrap_exception()

    def _wrap_exception(self):
        return tp.ExceptionWrapper(
            where="in DataLoader worker %d (emulated in this process by autosafe_torch)" % self.id)


# -- the iterator -----------------------------------------------------------------

class EmulatedWorkersIter(tp.BaseIter):
    """What ``DataLoader._get_iterator`` returns to emulate ``loader.num_workers``
    workers (kept at W: DataLoader then reuses a persistent iterator and calls
    ``_reset`` each epoch). ``shared``: what the copies share with the parent."""

    def __init__(self, loader):
        with SWAP_LOCK:  # the base seed comes from the parent's generator
            super().__init__(loader)
        if self._num_workers <= 0:
            raise ValueError("emulated workers need num_workers > 0")
        self._prefetch_factor = loader.prefetch_factor or 2
        self._in_order = getattr(loader, "in_order", True)
        worker_init_fn = loader.worker_init_fn
        if isinstance(self._dataset, tp.DATAPIPES):
            worker_init_fn = functools.partial(tp.sharding_worker_init_fn,
                                               worker_init_fn, self._world_size, self._rank)
        plan = CopyPlan((self._dataset, self._collate_fn, worker_init_fn), PARTS)
        # Every copy first, as each fork snapshots the parent before any
        # worker_init_fn has run.
        copies = [plan.copy() for _ in range(self._num_workers)]
        watched = list(plan.watched.values())
        self._descriptions = Descriptions(self._num_workers)
        self.shared = plan.shared + self._descriptions.shared
        self._workers = [
            EmulatedWorker(i, self._num_workers, self._base_seed, self._dataset_kind, copies[i],
                           self._auto_collation, self._drop_last, self._shared_seed,
                           self._descriptions, watched)
            for i in range(self._num_workers)]
        for worker in self._workers:
            worker.start()
        # The tasks sent: each run when the iterator needs its result.
        self._pending: collections.deque[tuple[int, EmulatedWorker, object]] = collections.deque()
        self._shutdown = False
        self._reset(loader, first_iter=True)

    def _reset(self, loader, first_iter=False):
        with SWAP_LOCK:  # a new sampler iterator (and a datapipe's shared seed)
            super()._reset(loader, first_iter)
        self._send_idx = 0
        self._rcvd_idx = 0
        self._task_info = {}
        self._tasks_outstanding = 0
        self._workers_status = [True] * self._num_workers
        self._workers_num_tasks = [0] * self._num_workers
        self._worker_queue_idx_cycle = itertools.cycle(range(self._num_workers))
        if not first_iter:
            # Persistent workers run what they were sent before the resume
            # (an epoch left early), then start their fetchers again.
            while self._pending:
                _task_idx, worker, index = self._pending.popleft()
                worker.run(index)
            for worker in self._workers:
                worker.resume(self._shared_seed)
        for _ in range(self._prefetch_factor * self._num_workers):
            self._try_put_index()

    @property
    def workers(self):
        """The emulated workers (none once shut down)."""
        return self._workers

    def _next_index(self):
        with SWAP_LOCK:  # the sampler may draw from the parent's generators
            return super()._next_index()

    def _next_data(self):
        # _MultiProcessingDataLoaderIter._next_data, with the results taken
        # from the emulated workers.
        while True:
            while self._rcvd_idx < self._send_idx:
                info = self._task_info.get(self._rcvd_idx, None)
                if info:
                    worker_id = info[0]
                    if len(info) == 2 or self._workers_status[worker_id]:
                        break
                    del self._task_info[self._rcvd_idx]
                self._rcvd_idx += 1
            else:
                if not self._persistent_workers:
                    self._shutdown_workers()
                raise StopIteration

            if len(self._task_info[self._rcvd_idx]) == 2:
                worker_id, data = self._task_info.pop(self._rcvd_idx)
                self._rcvd_idx += 1
                return self._process_data(data, worker_id)

            if self._shutdown or self._tasks_outstanding <= 0:
                raise AssertionError("Invalid iterator state: shutdown or no outstanding tasks "
                                     "when fetching next data")
            idx, data = self._next_result()
            self._tasks_outstanding -= 1
            if tp.is_iterable_kind(self._dataset_kind):  # noqa: SIM102 - as torch's _next_data reads
                if isinstance(data, tp.IterableStop):
                    self._workers_status[data.worker_id] = False
                    self._try_put_index()
                    continue

            if idx != self._rcvd_idx:
                if not self._in_order:
                    worker_id = self._task_info.pop(idx)[0]
                    return self._process_data(data, worker_id)
                self._task_info[idx] += (data,)
            else:
                worker_id = self._task_info.pop(idx)[0]
                self._rcvd_idx += 1
                return self._process_data(data, worker_id)

    def _next_result(self):
        while self._pending:
            task_idx, worker, index = self._pending.popleft()
            data = worker.run(index)
            if data is not _SKIPPED:
                return task_idx, data
        raise AssertionError("emulated workers: a result was awaited with no task outstanding")

    def _try_put_index(self):
        max_tasks = self._prefetch_factor * self._num_workers
        if self._tasks_outstanding >= max_tasks:
            raise AssertionError("Number of outstanding tasks exceeded maximum allowed tasks")
        try:
            index = self._next_index()
        except StopIteration:
            return
        for _ in range(self._num_workers):  # the next active worker, if any
            worker_queue_idx = next(self._worker_queue_idx_cycle)
            if self._workers_status[worker_queue_idx]:
                if self._in_order:
                    break
                if self._workers_num_tasks[worker_queue_idx] < max_tasks // sum(
                        self._workers_status):
                    break
        else:
            return
        self._pending.append((self._send_idx, self._workers[worker_queue_idx], index))
        self._task_info[self._send_idx] = (worker_queue_idx,)
        self._workers_num_tasks[worker_queue_idx] += 1
        self._tasks_outstanding += 1
        self._send_idx += 1

    def _process_data(self, data, worker_idx):
        self._workers_num_tasks[worker_idx] -= 1
        self._try_put_index()
        if isinstance(data, tp.ExceptionWrapper):
            data.reraise()
        if self._pin_memory:
            data = tp.pin_memory_module().pin_memory(data, self._pin_memory_device)
        return data

    def _shutdown_workers(self):
        if not getattr(self, "_shutdown", True):
            self._shutdown = True
            self._pending.clear()
            self._workers = []  # their dataset copies go with them
            self._descriptions.close()

    def __del__(self):
        self._shutdown_workers()
