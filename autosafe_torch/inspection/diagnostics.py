"""Where a worker's own account of its failure goes, for the parent to read.

``faulthandler_in_worker`` (a worker step) writes a crashing worker's
traceback, and on ``DUMP_SIGNAL`` every thread's stack, to ``dump_path``:
what "details are lost due to multiprocessing" loses. A worker that dies
while it starts (unpickling its dataset, importing the main module) leaves
its traceback at ``bootstrap_path``, in the directory its preparation data
names (``telling_workers``, ``told``); one that left no dump file never ran
its first step.
"""

import atexit
import contextlib
import faulthandler
import os
import shutil
import signal
import stat
import sys
import tempfile
import threading

from ..mp_private import forkserver_main, wrap_spawn

DUMP_SIGNAL = signal.SIGUSR1
# In a worker's preparation data: where it dumps, and (a warm one's) the parent's
# environment and umask at its start.
DUMPS_KEY = "autosafe_torch_dumps"
PARENT_KEY = "autosafe_torch_parent"

_dump_dir = None
_worker_dump = None  # in a worker: the open dump file, kept for faulthandler
_PREFIX = "autosafe_torch-workers-%d-"  # the pid of the process whose workers dump there


def dump_dir():
    """This process's private folder (0700, made on first use) for every file of
    ours: removed at exit (a record holds what it needs of it), or, where the
    process could not (SIGKILL, ``os._exit``), by the next run (``_sweep``)."""
    global _dump_dir
    if _dump_dir is None or not os.path.isdir(_dump_dir):
        _sweep()
        _dump_dir = tempfile.mkdtemp(prefix=_PREFIX % os.getpid())
        atexit.register(_remove, _dump_dir, os.getpid())
    return _dump_dir


def private_file(kind):
    fd, path = tempfile.mkstemp(prefix=kind + "-", dir=dump_dir())
    os.close(fd)
    return path


def _remove(directory, pid):
    """At exit (of the process that made it, not of a forked child)."""
    if os.getpid() == pid:
        shutil.rmtree(directory, ignore_errors=True)


def _sweep():
    """The folders of this user's runs that ended without removing theirs: a
    real folder (not a link), owned by this user, whose process is gone."""
    top = tempfile.gettempdir()
    head = _PREFIX.split("%", 1)[0]
    try:
        names = [n for n in os.listdir(top) if n.startswith(head)]
    except OSError:
        return
    for name in names:
        pid = name[len(head):].split("-", 1)[0]
        path = os.path.join(top, name)
        try:
            st = os.lstat(path)
            if not pid.isdigit() or not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
                continue
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except OSError:  # alive under another user (a pid reused), or unreadable: left
            continue


def dump_path(directory, worker_id, pid):
    return os.path.join(directory, "worker-%d-pid%d.txt" % (worker_id, pid))


def bootstrap_path(directory, pid):
    return os.path.join(directory, "starting-pid%d.txt" % pid)


def faulthandler_in_worker(directory, worker_id):
    """Worker step; the dump file stays open for faulthandler while it lives."""
    global _worker_dump
    try:
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


_telling = threading.local()  # .directory: while this thread starts workers of ours


@contextlib.contextmanager
def telling_workers(directory):
    """While this thread starts workers of ours, each is told ``directory`` in its
    preparation data, never found by a glob another user could answer with a link."""
    wrap_spawn("get_preparation_data", _with_directory)
    saved = getattr(_telling, "directory", None)
    _telling.directory = directory
    try:
        yield
    finally:
        _telling.directory = saved


def _with_directory(made, name):
    data = made(name)
    directory = getattr(_telling, "directory", None)
    if directory is not None:
        data.setdefault(DUMPS_KEY, directory)
    return data


def told(data):
    """In a worker starting, given its preparation data ``data``: the parent's
    environment and umask where a warm server's child was sent them; an
    exception that ends its start (which multiprocessing reports through
    ``sys.excepthook``) is also written to ``bootstrap_path`` in the directory
    ``data`` names, created there, never through a link."""
    parent = data.pop(PARENT_KEY, None)
    if parent is not None:
        os.environ.clear()
        os.environ.update(parent[0])
        os.umask(parent[1])
    directory = data.pop(DUMPS_KEY, None)
    if not directory:
        return
    shown = sys.excepthook

    def hook(kind, value, tb):
        try:
            import traceback  # noqa: PLC0415 - 1.0 ms at each spawned process's start, where activation imports this module (-X importtime: traceback, textwrap)

            fd = os.open(bootstrap_path(directory, os.getpid()),
                         os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0),
                         0o600)
            with os.fdopen(fd, "w") as f:
                traceback.print_exception(kind, value, tb, file=f)
        except Exception:
            pass
        shown(kind, value, tb)

    sys.excepthook = hook


def listen_as_spawned():
    """In a spawned process (activated before its start) or a server of ours:
    ``told`` before spawn's own preparation runs."""
    wrap_spawn("prepare", _told_then_prepare)


def _told_then_prepare(prepare, data):
    told(data)
    return prepare(data)


def in_fork_server():
    """In any fork server, or a child it forked that has not left ``forkserver.main``."""
    return forkserver_main() is not None
