"""OpenCV in DataLoader workers: ``setNumThreads(0)`` in each worker (a
worker_init step, and an after-fork hook for fork workers), OpenCL off in
the workers of a process that used OpenCL (CV402; its facts are in
``facts.py``). The program's own process, its threads, OpenCL and
environment, stays as it was.
"""

from __future__ import annotations

import functools
import multiprocessing
import sys
from multiprocessing import util

from ..config import CONFIG
from ..mp_private import process_target

# The only count a worker is ever given. OpenCV reads OPENCV_FOR_THREADS_NUM
# for a negative count only; 0 means no pool. Any non-zero count in a forked
# child hangs or crashes it (measured on every release, 4.5.1 .. 5.0.0).
WORKER_THREADS = 0


def _cv2():
    module = sys.modules.get("cv2")
    if module is None:
        import cv2 as module  # noqa: PLC0415 - optional dependency (cv2): imported only in a worker whose parent had it
    return module


def worker_threads_off(worker_id):  # worker steps, module level so that they pickle: CV401
    _cv2().setNumThreads(WORKER_THREADS)


def worker_opencl_off(worker_id):  # CV402
    ocl = getattr(_cv2(), "ocl", None)
    if ocl is not None:
        ocl.setUseOpenCL(False)


class _Hook:
    """What multiprocessing's after-fork registry holds weakly: the cache keeps it."""


@functools.cache
def install_fork_hook():
    """Register ``_after_fork``, once per process: multiprocessing runs it in
    each child, in ``Process._bootstrap``, before any code of the program."""
    hook = _Hook()
    util.register_after_fork(hook, _after_fork)
    return hook


def _after_fork(_owner):
    try:
        cv2 = sys.modules.get("cv2")
        if cv2 is None:
            return
        target = process_target(multiprocessing.current_process())
        if not (getattr(target, "__module__", None) or "").startswith("torch."):
            return  # not a DataLoader worker: said without importing torch
        import torch  # noqa: F401, PLC0415 - torch: this module loads at `import cv2`, before the program imports torch; before torch_private: torch's import runs our patches, which import torch_private

        from ..torch_private import is_worker_loop  # noqa: PLC0415 - imports torch (see above)

        if is_worker_loop(target) and CONFIG.mode == "fix" and CONFIG.rule_enabled("CV401", "cv2"):
            cv2.setNumThreads(WORKER_THREADS)
    except Exception:
        pass  # never break a worker's start
