"""OpenCV in DataLoader workers: ``setNumThreads(0)`` in each worker (a
worker_init step, and an after-fork hook for fork workers), OpenCL off in
workers forked from a process that used OpenCL, and the two facts CV402
reads: whether this process has loaded an OpenCL runtime, and whether an
OpenCL device is usable here.

Nothing here changes the program's own process: its OpenCV threads, its
OpenCL and its environment stay as they were (rules/cv2.py).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from ..config import CONFIG

# The only count a worker is ever given. OpenCV reads OPENCV_FOR_THREADS_NUM
# for a negative count only; 0 means no pool. Any non-zero count in a forked
# child hangs or crashes it (measured on every release, 4.5.1 .. 5.0.0).
WORKER_THREADS = 0


def _cv2():
    """cv2 in a worker: imported only because the parent had it."""
    module = sys.modules.get("cv2")
    if module is None:
        import cv2 as module  # noqa: PLC0415 - optional dependency
    return module


def worker_threads_off(worker_id):
    """Worker step for CV401 (module level, so that it pickles)."""
    _cv2().setNumThreads(WORKER_THREADS)


def worker_opencl_off(worker_id):
    """Worker step for CV402."""
    ocl = getattr(_cv2(), "ocl", None)
    if ocl is not None:
        ocl.setUseOpenCL(False)


# -- fork workers: as they fork, before any code of the program runs there -------

class _Hook:
    """What multiprocessing's after-fork registry holds (weakly): kept alive here."""


_hook = _Hook()
_installed: list[bool] = []


def install_fork_hook():
    """Register, once per process, ``_after_fork`` with multiprocessing: it
    runs in each child multiprocessing starts, in ``Process._bootstrap``,
    before the process's target; it acts only in torch's DataLoader workers."""
    if _installed:
        return
    from multiprocessing import util  # noqa: PLC0415 - cv2 may be imported before torch

    util.register_after_fork(_hook, _after_fork)
    _installed.append(True)


def _is_dataloader_worker(process):
    from ..mp_private import process_target  # noqa: PLC0415 - cv2 may be imported before torch

    target = process_target(process)
    if not (getattr(target, "__module__", None) or "").startswith("torch."):
        return False  # not torch's: said without importing torch
    import torch  # noqa: F401, PLC0415 - the target's; before torch_private, as our patches need

    from ..torch_private import is_worker_loop  # noqa: PLC0415 - imports torch

    return is_worker_loop(target)


def _after_fork(_owner):
    try:
        import multiprocessing  # noqa: PLC0415 - cv2 may be imported before torch

        cv2 = sys.modules.get("cv2")
        if cv2 is None or not _is_dataloader_worker(multiprocessing.current_process()):
            return
        if CONFIG.mode != "fix" or not CONFIG.rule_enabled("CV401", "cv2"):
            return
        cv2.setNumThreads(WORKER_THREADS)
    except Exception:
        pass  # never break a worker's start


# -- OpenCL: the facts ----------------------------------------------------------

_loaded: list[Any] = []


def _runtime_names(environ):
    path = environ.get("OPENCV_OPENCL_RUNTIME") or ""
    names = ["libOpenCL.so"]
    if path and path != "disabled":
        names.append(os.path.basename(path.split(":")[0]))
    return names


def opencl_runtime_loaded(environ=None):
    """The OpenCL runtime library OpenCV has loaded in this process, or None.

    OpenCV loads it on its first OpenCL call (``cv2.UMat`` work,
    ``cv2.ocl.useOpenCL()``), never at ``import cv2`` nor for plain arrays
    (measured, 5.0.0): loaded means this process has used OpenCL. A library
    stays loaded, so a yes is kept."""
    if _loaded:
        return _loaded[0]
    if "cv2" not in sys.modules:
        return None
    names = _runtime_names(os.environ if environ is None else environ)
    try:
        with open("/proc/self/maps") as maps:
            text = maps.read()  # one read and a substring test: cheap at each epoch
    except OSError:
        return None  # no /proc: not Linux, where workers are not forked
    for name in names:
        at = text.find("/" + name)
        if at >= 0:
            base = text[at + 1:text.find("\n", at)]
            _loaded.append(base)
            return base
    return None


_usable: dict[Any, bool] = {}


def opencl_device_usable(environ=None):
    """Whether OpenCV finds an OpenCL device it would use here, asked of a
    fresh interpreter with this environment (asking here would create the
    context that is the hazard). Cached per OPENCV_OPENCL_* setting. A probe
    that fails says yes: only consulted once this process has loaded a runtime."""
    import subprocess  # noqa: PLC0415 - only for the OpenCL probe (a child interpreter)

    env = dict(os.environ if environ is None else environ)
    key = tuple(sorted((k, v) for k, v in env.items() if k.startswith("OPENCV_OPENCL")))
    if key in _usable:
        return _usable[key]
    if env.get("OPENCV_OPENCL_RUNTIME") == "disabled":
        _usable[key] = False
        return False
    env["AUTOSAFE_TORCH"] = "0"
    try:
        out = subprocess.run(
            [sys.executable, "-c", "import cv2; print(int(cv2.ocl.haveOpenCL() and "
             "cv2.ocl.useOpenCL()))"], env=env, capture_output=True, text=True,
            timeout=60, check=False).stdout.split()
        usable = out[-1:] != ["0"]
    except Exception:
        usable = True
    _usable[key] = usable
    return usable
