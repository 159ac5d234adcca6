"""How many OS threads this process has, and whether a fork now is safe by that.

A forked child has only the thread that called fork(); whatever the others
held (a lock, an Objective-C class half initialised) stays held there. macOS
aborts such a child when it touches an Objective-C class ("+[NSNumber
initialize] may have been in progress in another thread when fork() was
called. Crashing instead."); Python 3.12+ warns ("This process (pid=...) is
multi-threaded, use of fork() may lead to deadlocks in the child."). C
libraries' threads (a BLAS pool, a telemetry client) count too.

On macOS the Objective-C runtime asks ``pthread_is_threaded_np()``, true once
a second thread has ever run: one thread only where it and ``task_threads``
both say so. Elsewhere, or unreadable: None, which a caller must take for unsafe.
"""

import ctypes
import functools
import os
import sys
import threading

__all__ = ["count", "single_threaded", "others_alive"]

_PORT = ctypes.c_uint  # mach_port_t, thread_act_t, mach_msg_type_number_t


def count():
    if sys.platform.startswith("linux"):
        try:
            return sum(1 for task in os.listdir("/proc/self/task") if not _fork_safe(task))
        except OSError:
            return None
    if sys.platform == "darwin":
        try:
            return _mach_thread_count()
        except Exception:
            return None
    return None


# Threads a fork leaves harmless, by their name (Linux's /proc/self/task/N/comm):
# jemalloc's background purging thread (pyarrow's allocator, which pandas imports)
# takes every lock of the allocator's in its own pthread_atfork handlers, and a
# child starts it again when it needs it.
FORK_SAFE_THREADS = frozenset({"jemalloc_bg_thd"})


def _fork_safe(task):
    try:
        with open("/proc/self/task/%s/comm" % task) as comm:
            return comm.read().strip() in FORK_SAFE_THREADS
    except OSError:
        return False  # gone meanwhile, or unreadable: counted


def single_threaded():
    """One thread (on macOS: and never had another); False where unknown."""
    if count() != 1:
        return False
    if sys.platform == "darwin":
        try:
            return _libsystem().pthread_is_threaded_np() == 0
        except Exception:
            return False
    return True


@functools.lru_cache(maxsize=1)
def _libsystem():
    lib, port = ctypes.CDLL("/usr/lib/libSystem.B.dylib"), _PORT
    for name, argtypes in (
            ("task_threads", [port, ctypes.POINTER(ctypes.POINTER(port)), ctypes.POINTER(port)]),
            ("mach_port_deallocate", [port, port]),
            ("vm_deallocate", [port, ctypes.c_size_t, ctypes.c_size_t]),
            ("pthread_is_threaded_np", [])):
        function = getattr(lib, name)
        function.argtypes, function.restype = argtypes, ctypes.c_int  # kern_return_t, or int
    return lib


def _mach_thread_count():
    lib, port = _libsystem(), _PORT
    task = port.in_dll(lib, "mach_task_self_").value  # what mach_task_self() reads
    threads, n = ctypes.POINTER(port)(), port()
    if lib.task_threads(task, ctypes.byref(threads), ctypes.byref(n)) != 0:
        return None
    try:
        return n.value
    finally:
        # task_threads gives a send right per thread and an array in our
        # address space: both are ours to release.
        for i in range(n.value):
            lib.mach_port_deallocate(task, threads[i])
        lib.vm_deallocate(task, ctypes.cast(threads, ctypes.c_void_p).value or 0,
                          n.value * ctypes.sizeof(port))


def others_alive():
    """The Python threads alive besides the main thread and autosafe_torch's own
    (a pool's workers, another loader's pin thread). None alive: a dataset's
    pool has no threads to lose at fork, its lock no holder but this thread."""
    main = threading.main_thread()
    return [t for t in threading.enumerate()
            if t is not main and not (t.name or "").startswith("autosafe_torch")]
