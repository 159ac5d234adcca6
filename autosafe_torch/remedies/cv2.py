"""OpenCV's thread pool and OpenCL off: in this process, for processes started
later (the environment), and in each DataLoader worker (a worker_init step)."""

import sys

# What the environment says to OpenCV in processes started from here.
# OPENCV_FOR_THREADS_NUM=0 means "the default" to OpenCV 5 (measured: two
# threads on two CPUs), so one thread: no pool.
ENV_THREADS = ("OPENCV_FOR_THREADS_NUM", "1")
ENV_OPENCL = ("OPENCV_OPENCL_RUNTIME", "disabled")


def threads_off(cv2, env):
    cv2.setNumThreads(0)
    env.setdefault(*ENV_THREADS)  # a value the user chose stays


def opencl_off(cv2, env):
    ocl = getattr(cv2, "ocl", None)
    if ocl is not None:
        ocl.setUseOpenCL(False)
    env.setdefault(*ENV_OPENCL)


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
    ocl = getattr(_cv2(), "ocl", None)
    if ocl is not None:
        ocl.setUseOpenCL(False)
