"""What a stretch of code opened, as the kernel says: the descriptors it added.

A dataset built again in a worker (``remedies/rebuild.py``) must read what the
training process's dataset reads. A pyarrow ``ParquetFile``, an Arrow IPC
reader over a memory map, a safetensors handle keep no path in their
attributes, so two handles of same-shaped files look alike. The kernel
knows: ``snapshot()`` before, ``opened_since(before)`` after, gives each
descriptor the code added and still holds, in the order it was opened
(numbers are handed out lowest first; no thread of ours closes one
meanwhile: ``TURNS``), with the file it is open on. A file only mapped
(safetensors maps its file and closes it) is in ``mapped_files()``.

Cheap: a directory listing before and after (tens of microseconds) and an
``fstat`` of each new descriptor; ``mapped_files`` reads ``/proc/self/maps``
(about half a millisecond), only where a rebuild is planned. Linux reads
``/proc/self``; macOS ``/dev/fd`` and ``F_GETPATH``. No user code runs.
"""

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


class Opened:
    """A descriptor some code added: ``kind`` FILE (a regular file: ``dev``,
    ``ino``, ``size``, ``mtime_ns`` say which and in what state) or OTHER (a
    socket, a pipe, a device: ``what`` says which)."""

    __slots__ = ("fd", "kind", "path", "dev", "ino", "size", "mtime_ns", "what")

    def __init__(self, fd, kind, path, dev=0, ino=0, size=0, mtime_ns=0, what=""):
        self.fd, self.kind, self.path, self.what = fd, kind, path, what
        self.dev, self.ino, self.size, self.mtime_ns = dev, ino, size, mtime_ns

    @property
    def identity(self):
        """Which file, in which state: equal for the same unchanged file."""
        return (self.dev, self.ino, self.size, self.mtime_ns)

    def name(self):
        return os.path.basename(self.path) if self.path else "fd %d" % self.fd

    def __reduce__(self):
        return Opened, (self.fd, self.kind, self.path, self.dev, self.ino, self.size,
                        self.mtime_ns, self.what)

    def __repr__(self):
        return "Opened(%s %s)" % (self.kind, self.path or self.what)


def snapshot():
    """``{fd: (device, inode)}`` of the descriptors open now."""
    return {fd: (st.st_dev, st.st_ino) for fd, st in _fd_stats()}


def opened_since(before):
    """``Opened`` for each descriptor open now on what it was not open on in
    ``before`` (a ``snapshot()``), lowest number first (the order they were
    opened in, where nothing was closed in between); what lies under
    ``SYSTEM_PLACES`` and torch's shared memory are left out."""
    found = (_describe(fd, st) for fd, st in _fd_stats()
             if before.get(fd) != (st.st_dev, st.st_ino))
    return [described for described in found if described is not None]


def _describe(fd, st):
    path = path_of(fd) or ""
    if stat.S_ISREG(st.st_mode):
        if path.startswith(SYSTEM_PLACES) or path.startswith("/memfd:") or OURS in path:
            return None
        return Opened(fd, FILE, path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if stat.S_ISCHR(st.st_mode) or stat.S_ISDIR(st.st_mode) or path.startswith(SYSTEM_PLACES):
        return None  # /dev/null, /dev/urandom, a directory handle (os.scandir): no data
    if stat.S_ISSOCK(st.st_mode):
        what = "a socket"
    elif stat.S_ISFIFO(st.st_mode):
        what = "a pipe"
    else:
        what = "a descriptor that is no file (%s)" % (path or "fd %d" % fd)
    return Opened(fd, OTHER, path, what=what)


def mapped_files():
    """``{(dev, ino): path}`` of the files this process maps now (Linux); empty
    elsewhere."""
    found = {}
    try:
        with open("/proc/self/maps", "rb") as maps:
            for line in maps:
                fields = line.split(None, 5)
                if len(fields) < 6 or not fields[5].startswith(b"/") \
                        or fields[5].startswith((b"/dev/", b"/memfd:")):
                    continue
                major, _, minor = fields[3].partition(b":")
                key = (os.makedev(int(major, 16), int(minor, 16)), int(fields[4]))
                found[key] = os.fsdecode(fields[5].rstrip())
    except (OSError, ValueError):
        return {}
    return found


# -- a thread of ours and the program's constructors take turns with descriptors ------

class _Turns:
    """``opened_since`` gives the order of opening only where no other thread
    closed a descriptor meanwhile: a number freed then goes to the program's
    next file, below the one it opened before. A thread of ours opens and
    closes descriptors while the program goes on (a fork server started ahead,
    ``warmstart.start_ahead``), and the program's next dataset is what the shim
    records then (``rebuild.measured``): its files came out in an order its
    constructor never opened them in, and each worker's build "differed". So
    they take turns. A recording waits for a stretch of ours to end (``ours``:
    it never waits on another process, milliseconds); ours waits for the other
    threads' recordings to end, and is entered before any lock of ours is
    taken (a constructor may start workers of its own); what ours closes after
    its stretch (``close``) waits for them too, closed by the last one's end."""

    def __init__(self):
        self.reset()

    def reset(self):
        """As new: in a forked child, whose only thread takes no turn yet."""
        self._cond = threading.Condition()
        self._recording = {}  # thread ident -> depth
        self._ours = {}
        self._deferred = []

    def _others(self, table):
        me = threading.get_ident()
        return any(ident != me for ident in table)

    def _enter(self, table, waits_for):
        me = threading.get_ident()
        with self._cond:
            self._cond.wait_for(lambda: not self._others(waits_for))
            table[me] = table.get(me, 0) + 1

    def _leave(self, table):
        me = threading.get_ident()
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

    @contextlib.contextmanager
    def recording(self):
        """While the program's code runs, and what it opens is recorded."""
        self._enter(self._recording, self._ours)
        try:
            yield
        finally:
            self._leave(self._recording)

    @contextlib.contextmanager
    def ours(self):
        """A stretch in which this thread of ours opens and closes descriptors;
        it yields ``end``, which ends it early (before a wait on another process)."""
        self._enter(self._ours, self._recording)
        ended = []

        def end():
            if not ended:
                ended.append(True)
                self._leave(self._ours)

        try:
            yield end
        finally:
            end()

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
