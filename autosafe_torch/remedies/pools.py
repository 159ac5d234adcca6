"""Thread pools held by a dataset, rebuilt in each worker with the same size (DL208):
a forked worker inherits a used pool without its threads (the first ``submit``
waits forever) and a spawned one cannot receive it (its lock and queue do not
pickle); each gets what a pool made lazily would be, new and empty.
"""

from concurrent.futures import ThreadPoolExecutor

from torch.utils.data import get_worker_info

from ..inspection import holdings
from ..mp_private import executor_arguments, pool_processes


def _new_pool(kind, max_workers, prefix):
    if kind == "executor":
        return ThreadPoolExecutor(max_workers, thread_name_prefix=prefix)
    from multiprocessing.pool import ThreadPool  # noqa: PLC0415 - 0.5 ms in each worker that rebuilds an executor, which imports this module (-X importtime after torch: multiprocessing.pool)

    return ThreadPool(max_workers)


def _recipe(pool):
    if isinstance(pool, ThreadPoolExecutor):
        return ("executor", *executor_arguments(pool))
    return "threadpool", pool_processes(pool), ""


def pool_reducers():
    from multiprocessing.pool import ThreadPool  # noqa: PLC0415 - as in _new_pool

    return dict.fromkeys((ThreadPoolExecutor, ThreadPool), lambda pool: (_new_pool, _recipe(pool)))


def rebuild_pools(obj):
    """The paths of the thread pools ``obj`` holds, replaced in place by new
    ones of the same size (a pool in a tuple is left)."""
    replaced, fresh = [], {}
    for here, pool, edge in holdings.find_thread_pools(obj, "dataset"):
        if edge is None or not edge.settable:
            continue
        if id(pool) not in fresh:
            fresh[id(pool)] = _new_pool(*_recipe(pool))
        edge.set(fresh[id(pool)])
        replaced.append(here)
    return replaced


def rebuild_pools_in_worker(worker_id):
    info = get_worker_info()
    if info is not None:
        rebuild_pools(info.dataset)
