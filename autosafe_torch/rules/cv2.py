"""OpenCV in DataLoader workers (CV401, CV402).

OpenCV runs its own thread pool (and, where there is a runtime, OpenCL).
Used inside DataLoader workers it oversubscribes the CPUs (workers x
OpenCV threads), and a pool that existed in the parent when a worker was
forked has been the classic cause of workers that hang in ``cv2.resize``.
The fix everyone applies by hand: ``cv2.setNumThreads(0)`` and
``cv2.ocl.setUseOpenCL(False)``.

Setting them in the parent reaches forked workers only; spawn and
forkserver workers import cv2 afresh. So the parent's settings are made
when cv2 is imported (``autosafe_torch.patches.cv2``, which also sets
OPENCV_FOR_THREADS_NUM and OPENCV_OPENCL_RUNTIME for child processes), and
every loader with workers gets a picklable ``worker_init_fn`` step that
makes them in the worker, before the user's own ``worker_init_fn``.

Nothing here imports cv2: the steps are added only when the program has
imported it, and a worker imports it only then.
"""

import sys

from ..workerinit import with_step
from . import rule

GROUP = "cv2"

# What the environment says to OpenCV in processes started from here.
# OPENCV_FOR_THREADS_NUM=0 means "the default" to OpenCV 5 (measured: two
# threads on two CPUs), so one thread: no pool.
ENV_THREADS = ("OPENCV_FOR_THREADS_NUM", "1")
ENV_OPENCL = ("OPENCV_OPENCL_RUNTIME", "disabled")


def _cv2():
    """cv2 in a worker: imported only because the parent had it."""
    module = sys.modules.get("cv2")
    if module is None:
        import cv2 as module
    return module


def worker_threads_off(worker_id):
    """Worker step for CV401 (module level, so that it pickles)."""
    _cv2().setNumThreads(0)


def worker_opencl_off(worker_id):
    """Worker step for CV402."""
    cv2 = _cv2()
    ocl = getattr(cv2, "ocl", None)
    if ocl is not None:
        ocl.setUseOpenCL(False)


def _add_step(check, values, step, what):
    if values["num_workers"] <= 0 or "cv2" not in sys.modules:
        return None
    old = values["worker_init_fn"]
    new = with_step(old, step)
    if new is old:
        return None
    return check.rule.finding(
        {"worker_init_fn": old}, {"worker_init_fn": new},
        "cv2 is imported; %s in each worker under every start method, before the "
        "worker_init_fn of the program" % what, strategy="worker_init_fn step")


@rule("CV401", "cv2-threads", GROUP,
      "cv2 imported: cv2.setNumThreads(0) in the parent and in every DataLoader worker",
      "DataLoader workers that hang in cv2 calls after fork; workers x OpenCV "
      "threads oversubscribing the CPUs",
      "call cv2.setNumThreads(0) at import and in worker_init_fn")
def cv2_threads(values, facts, defaults):
    return _add_step(cv2_threads, values, worker_threads_off, "cv2.setNumThreads(0)")


@rule("CV402", "cv2-opencl", GROUP,
      "cv2 imported: OpenCL off in the parent and in every DataLoader worker",
      "the same hangs, and every worker contending for the GPU through OpenCL",
      "call cv2.ocl.setUseOpenCL(False) at import and in worker_init_fn")
def cv2_opencl(values, facts, defaults):
    return _add_step(cv2_opencl, values, worker_opencl_off, "cv2.ocl.setUseOpenCL(False)")


CHECKS = (cv2_threads, cv2_opencl)
