"""The file descriptors a process holds, and those a loader's parts reach.

Often no object shows a descriptor forked workers would share
(``remedies/isolation.py``: a raw ``os.open()`` int, a closure cell, a weak
proxy, ``csv.reader``, libsndfile), so the hazard is read in the kernel
(``open_files``: ``/proc/self/fd``, ``/dev/fd`` on macOS). The object walk
(``find_descriptors``) only names them (``dataset.fh``, not ``fd 5``):
FileIO, sockets and the C wrappers above a FileIO are asked in C; no
``fileno()`` written in Python is called, so no user code runs.
"""

import collections
import contextlib
import functools
import io
import os
import stat
import sys

from . import objwalk
from .holdings import raw_file, stop_at_threading
from .objwalk import is_a


class HeldDescriptor(collections.namedtuple("HeldDescriptor", "path fd name")):
    """A regular file's descriptor, where it is first reached, and the file."""

    __slots__ = ()

    def describe(self):
        return "%s (fd %d, %s)" % (self.path, self.fd, self.name)


def descriptor_of(obj):
    """The descriptor ``obj`` owns at the kernel level, or None. C code only."""
    try:
        raw = raw_file(obj)  # a FileIO, or the one under a C text or buffered file
        if raw is not None:
            return None if raw.closed else io.FileIO.fileno(raw)
        socket = sys.modules.get("_socket")
        if socket is not None and is_a(obj, socket.socket):
            fd = socket.socket.fileno(obj)
            return fd if fd >= 0 else None
    except (ValueError, AttributeError, OSError):  # closed or detached
        return None
    return None


def _status(fd):
    """``(stat, status flags)``, or None (not open; a path handle: no offset;
    Windows: no fork)."""
    try:
        import fcntl  # noqa: PLC0415 - POSIX only: absent on Windows
    except ImportError:
        return None
    try:
        st, flags = os.fstat(fd), fcntl.fcntl(fd, fcntl.F_GETFL)
    except OSError:
        return None
    return None if flags & getattr(os, "O_PATH", 0) else (st, flags)


def file_name(fd):
    """The file's path as the user would read it, or ``fd N``."""
    path = path_of(fd)
    if path is None:
        return "fd %d" % fd
    try:
        relative = os.path.relpath(path)
    except ValueError:
        return path
    return relative if not relative.startswith("..") else path


def path_of(fd):
    """A path that names the file open on ``fd`` now, or None."""
    if sys.platform.startswith("linux"):
        try:
            path = os.readlink("/proc/self/fd/%d" % fd)
        except OSError:
            return None
        return None if path.endswith(" (deleted)") else path
    try:
        import fcntl  # noqa: PLC0415 - POSIX only: absent on Windows

        getpath = getattr(fcntl, "F_GETPATH", None)  # macOS
        if getpath is None:
            return None
        raw = fcntl.fcntl(fd, getpath, bytes(1024))
        return os.fsdecode(raw.split(b"\0", 1)[0])
    except OSError:
        return None


def find_descriptors(parts):
    """The regular files' descriptors reachable from ``parts``, each once (the
    first path that reaches it): a pipe, a socket, a terminal has no offset of
    ours to keep."""
    found, seen, held = [], set(), {}

    def stop(obj):  # reported, never entered: a kernel-level holder (its fd kept), a lock...
        fd = descriptor_of(obj)
        if fd is not None:
            held[id(obj)] = fd
            return True
        return stop_at_threading(obj)

    for name, part in parts.items():
        if part is None:
            continue
        for here, obj, _edge in objwalk.walk(part, name, stop=stop):
            fd = held.get(id(obj))
            if fd is None or fd in seen:
                continue
            seen.add(fd)
            status = _status(fd)
            if status is not None and stat.S_ISREG(status[0].st_mode):
                found.append(HeldDescriptor(here, fd, file_name(fd)))
    return found


# -- what the kernel says the process holds -------------------------------------


class OpenFile(collections.namedtuple("OpenFile", "fd dev ino flags offset name")):
    """``private``: open for reading; one only written stays shared (a log)."""

    __slots__ = ()

    @property
    def private(self):
        return self.flags & os.O_ACCMODE in (os.O_RDONLY, os.O_RDWR)

    def describe(self):
        return "%s (fd %d)" % (self.name, self.fd)


FD_DIRS = ("/proc/self/fd", "/dev/fd")  # Linux, then macOS and the BSDs
STDIO = 3  # 0, 1 and 2 are the terminal's or the launcher's: never touched


def _fd_stats():
    for directory in FD_DIRS:
        try:
            names = os.listdir(directory)
        except OSError:
            continue
        for fd in sorted(int(n) for n in names if n.isdigit()):
            try:
                yield fd, os.fstat(fd)
            except OSError:  # closed meanwhile (the listing's own descriptor)
                continue
        return


@functools.cache
def _shared_memory_devices():
    """Torch's shared memory (``/dev/shm``), shared on purpose; cached: a
    loader's every epoch asks."""
    try:
        return frozenset({os.stat("/dev/shm").st_dev})
    except OSError:
        return frozenset()


def describe_open(fd):
    """The ``OpenFile`` on ``fd``, or None: not a regular file, a path handle,
    torch's shared memory (``/dev/shm``, memfd)."""
    status = _status(fd)
    if status is None or not stat.S_ISREG(status[0].st_mode) \
            or status[0].st_dev in _shared_memory_devices():
        return None
    try:
        offset = os.lseek(fd, 0, os.SEEK_CUR)
    except OSError:
        return None
    with contextlib.suppress(OSError):
        if os.readlink("/proc/self/fd/%d" % fd).startswith("/memfd:"):
            return None
    return OpenFile(fd, status[0].st_dev, status[0].st_ino, status[1], offset, file_name(fd))


def open_files():
    """Every regular file this process holds open for reading but stdio and
    torch's shared memory, whoever holds it."""
    found = (describe_open(fd) for fd, _st in _fd_stats() if fd >= STDIO)
    return [described for described in found if described is not None and described.private]


# Devices every process may hold that no dataset reads: a terminal, the null device.
_ORDINARY_DEVICES = ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random", "/dev/tty",
                     "/dev/pts/", "/dev/ptmx", "/dev/console")


def shared_at_fork():
    """Whether this process holds what forked workers would share: a regular
    file open for reading, or a device other than a terminal or the null
    device (a camera). False: no object needs looking at for it."""
    return bool(open_files()) or any(
        fd >= STDIO and stat.S_ISCHR(st.st_mode)
        and not (path_of(fd) or "").startswith(_ORDINARY_DEVICES) for fd, st in _fd_stats())
