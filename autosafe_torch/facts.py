"""What the rules know about the platform.

Cheap, cached, and injectable: a rule receives a ``Facts`` object, so tests
build one (``Facts(start_method="spawn", ...)``) instead of patching the
machine. ``current()`` reads the real ones: what a program can change while
it runs (the start method, CUDA's initialisation...) fresh, the rest once.
"""

import dataclasses
import multiprocessing
import os
import subprocess
import sys
from typing import Any

from . import mp_private, rehearsal


@dataclasses.dataclass(eq=False)
class Facts:
    """The platform as the rules see it (None: unknown)."""

    platform: Any = None
    start_method: Any = None
    cpus_usable: Any = None
    cpus_affinity: Any = None  # what torch's own worker-count warning compares with
    accelerator: Any = None  # "cuda", "mps", "xpu", ... or None when none is usable
    cuda_initialized: Any = False
    shm_available: Any = None  # bytes free in /dev/shm (None also where not Linux)
    open_file_limit: Any = None  # RLIMIT_NOFILE as (soft, hard)
    sharing_strategy: Any = None  # torch's tensor sharing strategy
    # Whether this torch warns, every epoch, about pin_memory with no
    # accelerator (torch 2.0 ignores it silently).
    pin_memory_warns: Any = True

    def __post_init__(self):
        self.platform = self.platform or rehearsal.platform()
        self.start_method = self.start_method or default_start_method(self.platform)
        self.cpus_usable = self.cpus_usable or 1
        self.cpus_affinity = self.cpus_affinity or self.cpus_usable

    replace = dataclasses.replace


def default_start_method(platform=None):
    """The start method a platform uses when the program sets none."""
    platform = platform or sys.platform
    if platform == "darwin" or platform.startswith("win"):
        return "spawn"
    return "forkserver" if sys.version_info >= (3, 14) else "fork"


def effective_start_method(context=None):
    """The start method workers will use for ``multiprocessing_context``; the
    global setting read without fixing it (``allow_none``): the program may
    still choose."""
    if context is not None:
        if isinstance(context, str):
            return context
        try:
            return context.get_start_method()
        except Exception:
            return mp_private.context_name(context) or default_start_method()
    method = multiprocessing.get_start_method(allow_none=True)
    if method:
        return method
    try:
        return mp_private.default_start_method()
    except Exception:
        return default_start_method()


# -- the warm fork server (DL209): whether one of ours may run here

def fork_server_available(platform):
    return no_fork_server(platform) is None


def no_fork_server(platform):
    """Why no fork server of ours runs on ``platform`` (a ``sys.platform``), or
    None: it may. Not where multiprocessing's would listen in the abstract socket
    namespace, where any local user can connect (said on DL209's line)."""
    if platform.startswith("win") or getattr(sys, "frozen", False) \
            or "forkserver" not in multiprocessing.get_all_start_methods():
        return "no fork server on %s" % platform
    if platform.startswith("linux") and mp_private.forkserver_listens_abstract():
        return ("Python %d.%d.%d's fork server listens where any local user can connect "
                "(CVE-2022-42919: fixed in 3.9.16, 3.10.9, 3.11.1)" % sys.version_info[:3])
    return None


# -- OpenCL (CV402): whether this process used it, whether a device is usable here

_loaded: list[Any] = []


def opencl_runtime_loaded(environ=None):
    """The OpenCL runtime library OpenCV has loaded in this process, or None.
    OpenCV loads it on its first OpenCL call (``cv2.UMat`` work,
    ``cv2.ocl.useOpenCL()``), never at ``import cv2`` nor for plain arrays
    (measured, 5.0.0); a library stays loaded, so a yes is kept."""
    if _loaded:
        return _loaded[0]
    if "cv2" not in sys.modules:
        return None
    path = (os.environ if environ is None else environ).get("OPENCV_OPENCL_RUNTIME") or ""
    names = ["libOpenCL.so"]
    if path and path != "disabled":
        names.append(os.path.basename(path.split(":")[0]))
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
    env = dict(os.environ if environ is None else environ)
    key = tuple(sorted((k, v) for k, v in env.items() if k.startswith("OPENCV_OPENCL")))
    if key not in _usable:
        usable = False
        if env.get("OPENCV_OPENCL_RUNTIME") != "disabled":
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
    return _usable[key]


def _read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def cgroup_cpu_limit(root="/sys/fs/cgroup"):
    """CPUs allowed by the cgroup CPU quota (v2 ``cpu.max``, v1 cfs), or None."""
    text = _read(os.path.join(root, "cpu.max"))
    if text:
        quota, _, period = text.partition(" ")
        if quota == "max" or not period:
            return None
    else:  # v1: in the cpu controller's folder, or at the root
        quota, period = (_read(os.path.join(root, "cpu", name)) or _read(os.path.join(root, name))
                         for name in ("cpu.cfs_quota_us", "cpu.cfs_period_us"))
        if not (quota and period):
            return None
    try:
        return max(1, -(-int(quota) // int(period))) if text or int(quota) > 0 else None
    except ValueError:
        return None


def cpus_affinity():
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def cpus_usable():
    """CPUs this process may use: affinity, then the cgroup quota (PyTorch's
    own worker-count check reads only the affinity)."""
    count = cpus_affinity()
    limit = cgroup_cpu_limit()
    return min(count, limit) if limit else count


def accelerator():
    """The accelerator type torch would pin memory for, or None."""
    import torch  # noqa: PLC0415 - torch: 0.9 s at facts' import without torch (-X importtime), as in `autosafe-torch doctor`

    acc = getattr(torch, "accelerator", None)
    if acc is not None and hasattr(acc, "is_available"):
        if not acc.is_available():
            return None
        current = acc.current_accelerator()
        return current.type if current is not None else None
    if torch.cuda.is_available():
        return "cuda"
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return "mps"
    return None


def pin_memory_warns():
    """``torch_private.warns_pin_memory_without_accelerator()``; True where it fails."""
    try:
        import torch  # noqa: F401, PLC0415 - torch: 0.9 s at facts' import without torch (-X importtime), as in `autosafe-torch doctor`; before torch_private: torch's import runs our patches, which import torch_private

        from .torch_private import warns_pin_memory_without_accelerator  # noqa: PLC0415 - imports torch (0.9 s, as above), and only after torch itself

        return warns_pin_memory_without_accelerator()
    except Exception:
        return True


def cuda_initialized():
    try:
        import torch  # noqa: PLC0415 - torch: 0.9 s at facts' import without torch (-X importtime), as in `autosafe-torch doctor`

        return bool(torch.cuda.is_initialized())
    except Exception:
        return False


def shm_bytes(path="/dev/shm", field="f_blocks"):
    """The size of the shared-memory filesystem (Docker's default: 64 MiB)."""
    try:
        st = os.statvfs(path)
        return st.f_frsize * getattr(st, field)
    except (OSError, AttributeError):
        return None


def shm_available(path="/dev/shm"):
    """Bytes free in /dev/shm now (None where not Linux): where workers hand
    batches to the main process, under both sharing strategies (torch 2.13)."""
    return shm_bytes(path, "f_bavail") if sys.platform.startswith("linux") else None


def open_file_limit():
    """RLIMIT_NOFILE as (soft, hard), or None where there is none."""
    try:
        import resource  # noqa: PLC0415 - POSIX only: absent on Windows

        return resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return None


def sharing_strategy():
    """torch.multiprocessing's sharing strategy, without importing torch."""
    tmp = sys.modules.get("torch.multiprocessing")
    try:
        return tmp.get_sharing_strategy() if tmp is not None else None
    except Exception:
        return None


_static = {}
_override = None


def current(context=None):
    """The facts now, for a loader with ``multiprocessing_context``."""
    if _override is not None:
        return _override
    if not _static:
        _static.update(cpus_usable=cpus_usable(), cpus_affinity=cpus_affinity(),
                       accelerator=accelerator(),
                       pin_memory_warns=pin_memory_warns())
    return Facts(start_method=effective_start_method(context),
                 cuda_initialized=cuda_initialized(),
                 shm_available=shm_available(), open_file_limit=open_file_limit(),
                 sharing_strategy=sharing_strategy(), **_static)


def override(facts):
    """Make ``current()`` return ``facts`` (None restores the real ones)."""
    global _override
    _override = facts
