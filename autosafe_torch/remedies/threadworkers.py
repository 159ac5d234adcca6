"""Thread workers: rung 3 of the ladder.

For a map-style dataset that cannot go to worker processes, threads still
overlap the loading of several batches (decoding in cv2, PIL and torch
releases the GIL). The iterator is torch's single-process one, so the
sampler order, the fetching and the collation are exactly those of a
``num_workers=0`` run; batches are only fetched ahead, and yielded in order.
"""

import collections
from concurrent.futures import ThreadPoolExecutor

from torch.utils.data import _utils
from torch.utils.data.dataloader import _SingleProcessDataLoaderIter

PREFETCH_PER_THREAD = 2


class ThreadWorkersIter(_SingleProcessDataLoaderIter):
    def __init__(self, loader, threads):
        super().__init__(loader)
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="autosafe_torch-loader")
        self._pending = collections.deque()
        self._ahead = threads * PREFETCH_PER_THREAD

    def _next_data(self):
        while len(self._pending) < self._ahead:
            try:
                index = self._next_index()
            except StopIteration:
                break
            self._pending.append(self._pool.submit(self._dataset_fetcher.fetch, index))
        if not self._pending:
            self._pool.shutdown(wait=False)
            raise StopIteration
        data = self._pending.popleft().result()
        if self._pin_memory:
            data = _utils.pin_memory.pin_memory(data, self._pin_memory_device)
        return data

    def __del__(self):
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
