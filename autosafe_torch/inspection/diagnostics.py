"""Where a worker's own account of its failure goes, for the parent to read.

``faulthandler_in_worker`` (a worker step of recovery's) writes a crashing
worker's Python traceback, and on ``DUMP_SIGNAL`` every thread's stack, to
``dump_path``: what "details are lost due to multiprocessing" loses. A
worker that dies before its steps run, while it starts (unpickling its
dataset, importing the main module), leaves its traceback at
``bootstrap_path``: the warm server's children are told the directory
(``warmserver``), a spawned worker finds its parent's by name (the
directory's name holds the parent's pid; ``leave_start_traceback``). One
that left no dump file at all never ran its first step: it died starting.
Files of healthy workers are empty and removed at exit; the others stay,
and the log names them.
"""

import atexit
import glob
import os
import signal
import sys
import tempfile

DUMP_SIGNAL = signal.SIGUSR1
# Where a warm worker is told the directory, in its preparation data (``warmserver``),
# and the environment and umask of the parent at that start.
DUMPS_KEY = "autosafe_torch_dumps"
ENVIRON_KEY = "autosafe_torch_environ"
UMASK_KEY = "autosafe_torch_umask"

_dump_dir = None
_worker_dump = None  # in a worker: the open dump file, kept for faulthandler
_PREFIX = "autosafe_torch-workers-%d-"  # the pid of the process whose workers dump there


def dump_dir():
    """This process's directory for its workers' dumps, made on first use."""
    global _dump_dir
    if _dump_dir is None or not os.path.isdir(_dump_dir):
        _dump_dir = tempfile.mkdtemp(prefix=_PREFIX % os.getpid())
        atexit.register(_clean_dumps, _dump_dir, os.getpid())
    return _dump_dir


def current_dir():
    """The directory, if this process has made one (no side effect)."""
    return _dump_dir if _dump_dir is not None and os.path.isdir(_dump_dir) else None


# What workers tell this process (``process_state``'s reports): read here, never
# named in the log, so nothing to keep at exit.
REPORT_PREFIX = "report-"


def _clean_dumps(directory, pid):
    """At exit: drop the empty dump files (healthy workers) and the workers'
    reports; keep the others, which the log names."""
    if os.getpid() != pid:
        return
    try:
        for name in os.listdir(directory):
            path = os.path.join(directory, name)
            if name.startswith(REPORT_PREFIX) or os.path.getsize(path) == 0:
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
        import faulthandler  # noqa: PLC0415 - only in a worker

        # Open for the worker's life: faulthandler writes to it when the worker crashes.
        _worker_dump = open(dump_path(directory, worker_id, os.getpid()), "w")  # noqa: SIM115
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


def parents_dump_dir():
    """In a spawned worker: its parent's directory (made by ``dump_dir``, owned
    by this user), or None."""
    pattern = os.path.join(tempfile.gettempdir(), _PREFIX % os.getppid() + "*")
    for directory in glob.glob(pattern):
        try:
            if os.path.isdir(directory) and os.stat(directory).st_uid == os.getuid():
                return directory
        except OSError:
            continue
    return None


def leave_start_traceback(directory_of):
    """In a worker that is starting: an exception that ends its start is also
    written to ``bootstrap_path`` in ``directory_of()`` (looked up only then),
    for the parent's record. multiprocessing reports it through ``sys.excepthook``."""
    shown = sys.excepthook

    def hook(kind, value, tb):
        try:
            import traceback  # noqa: PLC0415 - rare; a spawned worker imports this at its start

            directory = directory_of()
            if directory is not None:
                with open(bootstrap_path(directory, os.getpid()), "w") as f:
                    traceback.print_exception(kind, value, tb, file=f)
        except Exception:
            pass
        shown(kind, value, tb)

    sys.excepthook = hook


def in_fork_server():
    """Whether this code runs inside a fork server's own process, or a child it
    forked before the child left ``forkserver.main`` (its loop is on the stack):
    multiprocessing's server, the warm one, a build server."""
    forkserver = sys.modules.get("multiprocessing.forkserver")
    if forkserver is None:
        return False
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is forkserver.main.__code__:
            return True
        frame = frame.f_back
    return False
