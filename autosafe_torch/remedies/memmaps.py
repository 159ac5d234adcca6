"""numpy memory maps sent to spawn/forkserver workers by reference (DL218).

Pickling a ``numpy.memmap`` copies its data: every worker start of a
spawn loader reads the whole mapped file into the pickle, and every worker
holds a private copy of it (300 MiB: 1.4 GiB and 15 s where mapping the
file in each worker takes 0.5 GiB and 13.6 s). What a worker gets is an
``np.memmap`` whose ``_mmap``, ``filename``, ``offset`` and ``mode`` are
None, writable, C- or Fortran-contiguous, with the bytes the parent's map
showed at that moment.

The reducer installed here gives the worker the same thing without the
copy: the file, the byte offset, shape, dtype and order travel, and the
worker maps the file again copy-on-write (``mmap.ACCESS_COPY``: writable,
private, as the pickled copy is), as an ``np.memmap`` with the same
attributes as a pickled one (so its slices are plain ndarrays, as they
are there). Its ``base`` is the map, not None: what a worker reads,
writes and computes is the same.

Exact or nothing: an array is sent by reference only where the worker can
map exactly what pickling would send, else it is pickled as it always was:

- its data lie in a shared file mapping of this process (``/proc/self/maps``:
  the file, the device and inode, the offset in the file), of a regular
  file that is where the kernel says it is now (same device and inode at
  that path: a moved file is mapped from where it went). A
  ``mode='c'`` memmap is a private mapping: it may hold changes of this
  process that are not in the file, so it is pickled. So is one whose file
  was deleted or replaced, and every array on a system without
  ``/proc/self/maps`` (macOS: the map keeps its descriptor to itself);
- its layout is the one pickling gives (C- or Fortran-contiguous, aligned,
  not empty): a strided view (``mm[:, ::2]``) is pickled.

Assumption, said in the rule's docs: the mapped file does not change while
the workers start and run. With ``mode='r+'``/``'w+'`` the parent's writes
through its map are in the page cache the worker maps (no ``flush`` is
needed for that; flushing to disk stays the user's business), so the worker
sees the file as it is when it maps it, not as it was when the worker was
asked for; and a private map shows later changes of the file in the pages
the worker has not written. The worker checks that the file is the same one
(device, inode, modification time, size) and fails loudly otherwise: its
start fails, the record says the fix did not hold, and the recovery ladder
takes over. It never maps other data silently.

Only while a process is being started (``get_spawning_popen()``: spawn,
forkserver and the warm server set it while they pickle what the child
gets): a memmap put on a queue later is pickled as before.
"""

import mmap
import os
import stat

from .pickling import PROTOCOL, install

MAPS = "/proc/self/maps"


class MappedFileChanged(RuntimeError):
    """In a worker: the file a memmap was sent by reference from is gone or changed."""


class Mapping:
    """One line of ``/proc/self/maps``: an address range of a file."""

    __slots__ = ("start", "end", "shared", "offset", "device", "inode", "path")

    def __init__(self, start, end, shared, offset, device, inode, path):
        self.start, self.end, self.shared = start, end, shared
        self.offset, self.device, self.inode, self.path = offset, device, inode, path


def file_mappings():
    """The file mappings of this process, or None where there is no ``/proc/self/maps``."""
    try:
        with open(MAPS) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    found = []
    for line in lines:
        fields = line.split(None, 5)
        if len(fields) < 6 or not fields[5].startswith("/"):
            continue  # anonymous, heap, stack, [vdso]
        try:
            start, end = (int(x, 16) for x in fields[0].split("-"))
            major, minor = (int(x, 16) for x in fields[3].split(":"))
            found.append(Mapping(start, end, fields[1][3:4] == "s", int(fields[2], 16),
                                 os.makedev(major, minor), int(fields[4]), fields[5]))
        except ValueError:
            continue
    return found


class Reference:
    """What a worker needs to map an array again: the file and what it was
    (``ident``: device, inode, mtime in ns), the mapping's start in the file
    (a multiple of ``mmap.ALLOCATIONGRANULARITY``), its length, where the data
    begin in it, and the array's shape, dtype and order."""

    __slots__ = ("path", "ident", "start", "length", "delta", "shape", "dtype", "order")

    def __init__(self, path, ident, start, length, delta, shape, dtype, order):
        self.path, self.ident, self.start, self.length = path, ident, start, length
        self.delta, self.shape, self.dtype, self.order = delta, shape, dtype, order

    def args(self):
        return (self.path, self.ident, self.start, self.length, self.delta, self.shape,
                self.dtype, self.order)


def reference(arr, mappings=()):
    """``(Reference, None)`` where ``arr`` (an ``np.memmap``) can travel by
    reference exactly, else ``(None, why not)``. ``mappings``: ``file_mappings()``
    if already read (None: there are none to read)."""
    mappings = file_mappings() if mappings == () else mappings
    if mappings is None:
        return None, "no %s here to find the mapped file" % MAPS
    try:
        flags = arr.flags
        if arr.nbytes == 0:
            return None, "empty"
        if not (flags.c_contiguous or flags.f_contiguous) or not flags.aligned:
            return None, "a strided or unaligned view: pickled in another layout"
        if arr.dtype.hasobject:
            return None, "holds objects"
        address = arr.__array_interface__["data"][0]
        nbytes = arr.nbytes
    except Exception as exc:  # not what it seems: leave it to pickle
        return None, type(exc).__name__
    where = next((m for m in mappings if m.start <= address < m.end), None)
    if where is None:
        return None, "its data are not in a file mapping"
    if address + nbytes > where.end:
        return None, "its data span more than one mapping"
    if not where.shared:
        return None, "a private (mode='c') map may hold changes not in the file"
    try:
        st = os.stat(where.path)
    except OSError as exc:
        return None, "its file is gone (%s)" % type(exc).__name__
    if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (where.device, where.inode):
        return None, "the file at its path is not the one mapped"
    offset = where.offset + (address - where.start)
    start = offset - offset % mmap.ALLOCATIONGRANULARITY
    if offset + nbytes > st.st_size:
        return None, "the file is shorter than the map"
    order = "F" if flags.f_contiguous and not flags.c_contiguous else "C"
    return Reference(where.path, (st.st_dev, st.st_ino, st.st_mtime_ns), start,
                     offset - start + nbytes, offset - start, arr.shape, arr.dtype,
                     order), None


def mapped_again(path, ident, start, length, delta, shape, dtype, order):
    """In a worker: the array pickling would have given, mapped from the file
    copy-on-write; ``MappedFileChanged`` if the file is not the one it was."""
    import numpy as np

    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            if (st.st_dev, st.st_ino, st.st_mtime_ns) != tuple(ident) \
                    or st.st_size < start + length:
                raise MappedFileChanged(
                    "%s changed after the training process sent its memmap by reference "
                    "(DL218): this worker cannot map the data it was sent" % path)
            mm = mmap.mmap(f.fileno(), length, access=mmap.ACCESS_COPY, offset=start)
    except OSError as exc:
        raise MappedFileChanged("%s cannot be mapped again in this worker (DL218): %s"
                                % (path, exc)) from exc
    # Built as pickling builds it: memmap's __array_finalize__ sees no memmap
    # and sets _mmap, filename, offset and mode to None.
    return np.ndarray.__new__(np.memmap, shape, dtype=dtype, buffer=mm, offset=delta,
                              order=order)


def reduce_memmap(arr):
    """ForkingPickler's reducer for ``np.memmap``: by reference while a process
    is being started and the array can go exactly; else as pickle does."""
    from multiprocessing.context import get_spawning_popen

    if get_spawning_popen() is not None:
        ref, _why = reference(arr)
        if ref is not None:
            return mapped_again, ref.args()
    return arr.__reduce_ex__(PROTOCOL)


def install_reducers():
    import numpy as np

    install({np.memmap: reduce_memmap})


def size_text(nbytes):
    """``300 MiB``, ``12 KiB``, ``5 bytes``."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= size:
            value = nbytes / size
            return ("%.0f %s" if value >= 10 else "%.1f %s") % (value, unit)
    return "%d bytes" % nbytes
