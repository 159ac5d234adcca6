"""The file descriptors a loader's parts reach: what forked workers share.

A forked worker inherits every descriptor of its parent with the same open
file description, and so the same file offset: a dataset that seeks and
reads a file opened in ``__init__`` reads its siblings' bytes. Which object
holds the descriptor does not matter (a plain file, a GzipFile, a ZipFile,
a TarFile, numpy's NpzFile, a user's wrapper), so this module knows no
library's types: one general mechanism, the descriptor.

- The kernel-level holders are asked for their descriptor, in C only:
  ``io.FileIO`` and ``socket.socket`` (``fileno()``), and the C wrappers
  above a FileIO (``TextIOWrapper.buffer``, ``Buffered*.raw``).
- Every other object is entered by the one walker (``objwalk``): the file
  objects a GzipFile, ZipFile or user class keeps in ``fp``, ``fileobj``,
  ``_fp``, ``_f``... are found where they hang. A ``fileno()`` written in
  Python (GzipFile's, a user's) is never called: it is user code.

Nothing is changed and no user code runs; an object that cannot be looked
at is skipped (``objwalk.walk``).
"""

import io
import os
import stat
import sys

from . import objwalk
from .holdings import raw_file, stop_at_threading
from .objwalk import is_a

READ_ONLY, READ_WRITE, WRITE_ONLY = "read-only", "read-write", "write-only"


class HeldDescriptor:
    """A descriptor, where it is first reached, and what it is open on.

    ``access``: READ_ONLY, READ_WRITE or WRITE_ONLY; ``regular``: a regular
    file (a file offset that matters); ``dev``/``ino``: which file, to tell a
    descriptor number reused for another file.
    """

    __slots__ = ("path", "fd", "access", "regular", "dev", "ino", "name")

    def __init__(self, path, fd, access, regular, dev, ino, name):
        self.path = path
        self.fd = fd
        self.access = access
        self.regular = regular
        self.dev = dev
        self.ino = ino
        self.name = name

    @property
    def shared_offset(self):
        """Whether forked workers reading it would share an offset (a regular file)."""
        return self.regular

    def describe(self):
        return "%s (fd %d, %s)" % (self.path, self.fd, self.name)

    def __repr__(self):
        return "HeldDescriptor(%s, %s)" % (self.describe(), self.access)


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


def _describe_fd(fd):
    """``(access, regular, dev, ino, name)`` of an open descriptor, or None."""
    try:
        import fcntl
    except ImportError:  # Windows: no fork, nothing shares an offset
        return None
    try:
        st = os.fstat(fd)
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    except OSError:
        return None
    if flags & getattr(os, "O_PATH", 0):
        return None  # a path handle: no reads, no offset
    mode = flags & os.O_ACCMODE
    access = {os.O_RDONLY: READ_ONLY, os.O_WRONLY: WRITE_ONLY}.get(mode, READ_WRITE)
    return access, stat.S_ISREG(st.st_mode), st.st_dev, st.st_ino, file_name(fd)


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
        import fcntl

        getpath = getattr(fcntl, "F_GETPATH", None)  # macOS
        if getpath is None:
            return None
        raw = fcntl.fcntl(fd, getpath, bytes(1024))
        return os.fsdecode(raw.split(b"\0", 1)[0])
    except OSError:
        return None


def find_descriptors(parts, items=None):
    """The descriptors reachable from ``parts`` (``{name: object}``, e.g. the
    dataset, collate_fn and worker_init_fn), each once (the first path that
    reaches it), in walk order. ``items``: look at that many items of each
    container (``objwalk.SAMPLE_ITEMS`` to decide; None to act)."""
    found, seen, held = [], set(), {}

    def stop(obj):
        """A kernel-level holder (its descriptor kept for the loop below) or a
        lock, thread or logger: reported, never entered."""
        fd = descriptor_of(obj)
        if fd is not None:
            held[id(obj)] = fd
            return True
        return stop_at_threading(obj)

    for name, part in parts.items():
        if part is None:
            continue
        for here, obj, _edge in objwalk.walk(part, name, stop=stop, items=items):
            fd = held.get(id(obj))
            if fd is None or fd in seen:
                continue
            seen.add(fd)
            described = _describe_fd(fd)
            if described is not None:
                found.append(HeldDescriptor(here, fd, *described))
    return found
