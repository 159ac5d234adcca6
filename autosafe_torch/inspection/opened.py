"""What a stretch of code opened, as the kernel says: the descriptors it added.

A dataset built again in a worker (``remedies/rebuild.py``) must read what the
training process's dataset reads, and a pyarrow ``ParquetFile``, an Arrow IPC
reader over a memory map, a safetensors handle keep no path in their
attributes: ``snapshot()`` before, ``opened_since(before)`` after, gives each
descriptor the code added and still holds, in the order it was opened
(numbers are handed out lowest first; no thread of ours closes one
meanwhile: ``TURNS``). A file only mapped (safetensors closes its file) is in
``mapped_files()``.

Cheap: a directory listing before and after (tens of microseconds) and an
``fstat`` of each new descriptor; ``mapped_files`` reads ``/proc/self/maps``
(about half a millisecond), only where a rebuild is planned.
"""

import collections
import contextlib
import os
import stat
import threading

from .descriptors import _fd_stats, path_of

# Where libraries read the machine, not the data (CPU counts, cgroup limits,
# random bytes): what they open there is no part of a dataset.
SYSTEM_PLACES = ("/proc/", "/sys/", "/dev/")
# What autosafe_torch itself opens meanwhile, in another thread (a build server's
# recipes, workers' dumps): named so that it is never taken for the program's.
OURS = "autosafe_torch-"
FILE, OTHER = "file", "other"


class Opened(collections.namedtuple("Opened", "fd kind path identity what")):
    """``kind`` FILE (``identity``: device, inode, size and mtime_ns, equal for
    the same unchanged file) or OTHER (``what``: a socket, a pipe...)."""

    __slots__ = ()


def snapshot():
    return {fd: (st.st_dev, st.st_ino) for fd, st in _fd_stats()}


def opened_since(before):
    """``Opened`` for each descriptor open now on what it was not open on in
    ``before``, lowest first, but under ``SYSTEM_PLACES`` and torch's shared memory."""
    found = (_describe(fd, st) for fd, st in _fd_stats()
             if before.get(fd) != (st.st_dev, st.st_ino))
    return [described for described in found if described is not None]


def _describe(fd, st):
    path = path_of(fd) or ""
    if stat.S_ISREG(st.st_mode):
        if path.startswith((*SYSTEM_PLACES, "/memfd:")) or OURS in path:
            return None
        return Opened(fd, FILE, path, (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns), "")
    if stat.S_ISCHR(st.st_mode) or stat.S_ISDIR(st.st_mode) or path.startswith(SYSTEM_PLACES):
        return None  # /dev/null, /dev/urandom, a directory handle (os.scandir): no data
    if stat.S_ISSOCK(st.st_mode):
        what = "a socket"
    elif stat.S_ISFIFO(st.st_mode):
        what = "a pipe"
    else:
        what = "a descriptor that is no file (%s)" % (path or "fd %d" % fd)
    return Opened(fd, OTHER, path, None, what)


def mapped_files():
    """``{(dev, ino): path}`` of the files this process maps now (Linux)."""
    from .mappings import read_maps  # noqa: PLC0415 - mappings imports ctypes; maps are read only where a rebuild is planned

    return {(m.device, m.inode): m.path for m in read_maps() or ()
            if not m.path.startswith(("/dev/", "/memfd:"))}


# -- a thread of ours and the program's constructors take turns with descriptors ------

class _Turns:
    """``opened_since`` gives the order of opening only where no other thread
    closed a descriptor meanwhile (a freed number goes to the program's next
    file): a thread of ours (``warmstart.start_ahead``) doing so while the
    shim records a dataset (``rebuild.measured``) made each worker's build
    "differ". So a recording waits for a stretch of ours to end (milliseconds,
    never a wait on another process); ours waits for other threads'
    recordings, entered before any lock of ours (a constructor may start
    workers of its own); what ours closes later (``close``) waits for the
    last recording's end."""

    def __init__(self):
        self._cond = threading.Condition()
        self._recording = {}  # thread ident -> depth
        self._ours = {}
        self._deferred = []

    reset = __init__  # as new in a forked child, whose only thread takes no turn yet

    def _others(self, table):
        me = threading.get_ident()
        return any(ident != me for ident in table)

    @contextlib.contextmanager
    def _turn(self, table, waits_for):
        """This thread's stretch in ``table``, once none other is in ``waits_for``
        (``end``, yielded, ends it early)."""
        me = threading.get_ident()
        with self._cond:
            self._cond.wait_for(lambda: not self._others(waits_for))
            table[me] = table.get(me, 0) + 1
        ended = []

        def end():
            if ended:
                return
            ended.append(True)
            with self._cond:
                table[me] -= 1
                if not table[me]:
                    del table[me]
                if not self._recording:
                    for fd in self._deferred:
                        with contextlib.suppress(OSError):
                            os.close(fd)
                    self._deferred = []
                self._cond.notify_all()

        try:
            yield end
        finally:
            end()

    def recording(self):  # while the program's code runs, and what it opens is recorded
        return self._turn(self._recording, self._ours)

    def ours(self):
        """A stretch in which this thread of ours opens and closes descriptors
        (``end`` it before a wait on another process)."""
        return self._turn(self._ours, self._recording)

    def close(self, fd):
        """Close ``fd`` (ours) now, or once no other thread records."""
        with self._cond:
            if self._others(self._recording):
                self._deferred.append(fd)
            else:
                os.close(fd)


TURNS = _Turns()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=TURNS.reset)
