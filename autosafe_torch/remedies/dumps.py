"""Where a worker's own account of its failure goes, for the parent to read.

``faulthandler_in_worker`` (a worker step of recovery's) writes a crashing
worker's Python traceback, and on ``DUMP_SIGNAL`` every thread's stack, to
``dump_path``: what "details are lost due to multiprocessing" loses. A
worker that dies before its steps run, while it starts (unpickling its
dataset, importing the main module), leaves its traceback at
``bootstrap_path`` where the shim owns that path: the warm server's
children (``warmserver``). Files of healthy workers are empty and removed
at exit; the others stay, and the log names them.
"""

import atexit
import os
import signal
import tempfile

DUMP_SIGNAL = signal.SIGUSR1
# Where a warm worker is told the directory, in its preparation data (``warmserver``).
DUMPS_KEY = "autosafe_torch_dumps"

_dump_dir = None
_worker_dump = None  # in a worker: the open dump file, kept for faulthandler


def dump_dir():
    """This process's directory for its workers' dumps, made on first use."""
    global _dump_dir
    if _dump_dir is None or not os.path.isdir(_dump_dir):
        _dump_dir = tempfile.mkdtemp(prefix="autosafe_torch-workers-")
        atexit.register(_clean_dumps, _dump_dir, os.getpid())
    return _dump_dir


def current_dir():
    """The directory, if this process has made one (no side effect)."""
    return _dump_dir if _dump_dir is not None and os.path.isdir(_dump_dir) else None


def _clean_dumps(directory, pid):
    """At exit: drop the empty dump files (healthy workers); keep the others,
    which the log names."""
    if os.getpid() != pid:
        return
    try:
        for name in os.listdir(directory):
            path = os.path.join(directory, name)
            if os.path.getsize(path) == 0:
                os.unlink(path)
        os.rmdir(directory)
    except OSError:
        pass


def dump_path(directory, worker_id, pid):
    return os.path.join(directory, "worker-%d-pid%d.txt" % (worker_id, pid))


def bootstrap_path(directory, pid):
    """Where a worker that died while starting wrote its traceback."""
    return os.path.join(directory, "starting-pid%d.txt" % pid)


def faulthandler_in_worker(directory, worker_id):
    """Worker step: a crash writes the worker's traceback, and DUMP_SIGNAL
    every thread's stack, to its file (what "details are lost due to
    multiprocessing" loses)."""
    global _worker_dump
    try:
        import faulthandler

        _worker_dump = open(dump_path(directory, worker_id, os.getpid()), "w")
        faulthandler.enable(_worker_dump, all_threads=True)
        faulthandler.register(DUMP_SIGNAL, _worker_dump, all_threads=True)
    except Exception:
        pass  # diagnostics only: the worker runs without them


def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""
