"""Memory maps sent to spawn/forkserver workers by reference: numpy memmaps
(DL218) and ``mmap.mmap`` objects of named files (DL201).

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

An ``mmap.mmap`` does not pickle at all (TypeError): the baseline is what a
forked worker holds, the parent's map at the fork. The worker maps the same
range of the same file again, with the same access (``ACCESS_READ``, a
shared writable map as ``ACCESS_WRITE``, ``ACCESS_COPY``) and at the same
position. A shared map shows the file's page cache, so the worker sees what
the parent's map shows, as a forked one does: the file need only be the
same file (device and inode), not unchanged. A private (``ACCESS_COPY``)
map goes only while it holds no page the parent wrote (``Anonymous: 0 kB``
in ``/proc/self/smaps``); an anonymous map, a deleted file, a map made
with ``prot``/``flags`` this does not rebuild, and every map where there
is no ``/proc/self/maps`` are not sent: the DL201 ladder goes on (fork,
emulated workers, or a clear refusal).

The platform the rules see decides (``autosafe-torch run --as macos``): a
rehearsed Mac has no ``/proc/self/maps`` either.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import weakref
from multiprocessing.context import get_spawning_popen
from typing import Any, cast

from .mappings import MAPS, MappedFileChanged, file_mappings, mapped_file, written_pages
from .pickling import PROTOCOL, install


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
    where, st, why = mapped_file(address, nbytes, mappings)
    if where is None:
        return None, why
    if not where.shared:
        return None, "a private (mode='c') map may hold changes not in the file"
    offset = where.offset + (address - where.start)
    start = offset - offset % mmap.ALLOCATIONGRANULARITY
    order = "F" if flags.f_contiguous and not flags.c_contiguous else "C"
    return Reference(where.path, (st.st_dev, st.st_ino, st.st_mtime_ns), start,
                     offset - start + nbytes, offset - start, arr.shape, arr.dtype,
                     order), None


def mapped_again(path, ident, start, length, delta, shape, dtype, order):
    """In a worker: the array pickling would have given, mapped from the file
    copy-on-write; ``MappedFileChanged`` if the file is not the one it was."""
    import numpy as np  # noqa: PLC0415 - optional dependency

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
    if get_spawning_popen() is not None:
        ref, _why = reference(arr)
        if ref is not None:
            return mapped_again, ref.args()
    return arr.__reduce_ex__(PROTOCOL)


def install_reducers():
    import numpy as np  # noqa: PLC0415 - optional dependency

    install({np.memmap: reduce_memmap})


# -- mmap.mmap ----------------------------------------------------------------------

# How a worker maps again what ``/proc/self/maps`` shows: shared read-only,
# shared writable, private writable (the access modes that make them).
ACCESS = {"read": mmap.ACCESS_READ, "write": mmap.ACCESS_WRITE, "copy": mmap.ACCESS_COPY}


class MapReference:
    """What a worker needs to map an ``mmap.mmap`` again: the file (``ident``:
    device and inode), the map's start in it and length, how it is mapped
    (a key of ``ACCESS``) and the map's position."""

    __slots__ = ("path", "ident", "start", "length", "how", "position")

    def __init__(self, path, ident, start, length, how, position):
        self.path, self.ident, self.start, self.length = path, ident, start, length
        self.how, self.position = how, position

    def args(self):
        return (self.path, self.ident, self.start, self.length, self.how, self.position)


def map_reference(m, mappings=()):
    """``(MapReference, None)`` where the ``mmap.mmap`` ``m`` maps a named file
    that a worker can map again exactly, else ``(None, why not)``."""
    if type(m) is not mmap.mmap:  # the type the reducer is registered for
        return None, "not an mmap.mmap"
    if anonymous(m):
        return None, "an anonymous map (it has no file to map again)"
    mappings = file_mappings() if mappings == () else mappings
    if mappings is None:
        return None, "no %s here to find the mapped file" % MAPS
    try:
        if m.closed:
            return None, "closed"
        address, length = buffer_address(m)
        position = m.tell()
    except Exception as exc:  # not what it seems: leave it as it is
        return None, type(exc).__name__
    where, st, why = mapped_file(address, length, mappings)
    if where is None:
        return None, "an anonymous map" if why.endswith("not in a file mapping") else why
    how = _access(m, where)
    if how is None:
        return None, "a map made with prot/flags (%s) that is not rebuilt" % where.perms
    if how == "copy" and written_pages(where) != 0:
        return None, "a private (ACCESS_COPY) map this process wrote to: its changes are in no file"
    return MapReference(where.path, (st.st_dev, st.st_ino),
                        where.offset + (address - where.start), length, how, position), None


def _access(m, where):
    """The key of ``ACCESS`` that maps as ``m`` is mapped, or None."""
    perms = where.perms
    if perms == "rw-s":
        return "write"  # ACCESS_WRITE, or ACCESS_DEFAULT on a file opened for writing
    if perms == "rw-p":
        return "copy"
    if perms == "r--s":
        try:
            m.write(b"")  # ACCESS_READ refuses any write; nothing is written otherwise
        except TypeError:
            return "read"
        return None  # prot=PROT_READ with ACCESS_DEFAULT: a write would crash there
    return None


def buffer_address(obj):
    """``(address, length)`` of the memory ``obj`` exports (the buffer protocol)."""
    api, struct = _buffer_api()
    view = struct()
    if api.PyObject_GetBuffer(obj, ctypes.byref(view), 0) != 0:
        raise BufferError("no buffer")
    try:
        return view.buf, view.len
    finally:
        api.PyBuffer_Release(ctypes.byref(view))


_BUFFER_API: list[Any] = []


def _buffer_api():
    """The C API's buffer functions and ``Py_buffer``, typed on a library
    handle of our own (``ctypes.pythonapi``'s functions are the user's to type)."""
    if not _BUFFER_API:
        class PyBuffer(ctypes.Structure):  # Py_buffer, as the stable ABI defines it
            _fields_ = [("buf", ctypes.c_void_p), ("obj", ctypes.c_void_p),
                        ("len", ctypes.c_ssize_t), ("itemsize", ctypes.c_ssize_t),
                        ("readonly", ctypes.c_int), ("ndim", ctypes.c_int),
                        ("format", ctypes.c_char_p), ("shape", ctypes.c_void_p),
                        ("strides", ctypes.c_void_p), ("suboffsets", ctypes.c_void_p),
                        ("internal", ctypes.c_void_p)]

        api = ctypes.PyDLL(None)
        api.PyObject_GetBuffer.argtypes = [ctypes.py_object, ctypes.POINTER(PyBuffer),
                                           ctypes.c_int]
        api.PyObject_GetBuffer.restype = ctypes.c_int
        api.PyBuffer_Release.argtypes = [ctypes.POINTER(PyBuffer)]
        api.PyBuffer_Release.restype = None
        _BUFFER_API[:] = [api, PyBuffer]
    return _BUFFER_API


def map_again(path, ident, start, length, how, position):
    """In a worker (or for an emulated worker's copy): the map a forked worker
    would hold, mapped again from the file; ``MappedFileChanged`` if the file
    at ``path`` is not the one mapped."""
    try:
        fd = os.open(path, (os.O_RDWR if how == "write" else os.O_RDONLY) | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != tuple(ident) or st.st_size < start + length:
                raise MappedFileChanged(
                    "%s is not the file the training process mapped (DL201): this worker "
                    "cannot map the data it was sent" % path)
            m = mmap.mmap(fd, length, access=ACCESS[how], offset=start)
        finally:
            os.close(fd)
    except OSError as exc:
        raise MappedFileChanged("%s cannot be mapped again in this worker (DL201): %s"
                                % (path, exc)) from exc
    m.seek(position)
    return m


def anonymous(m):
    """Whether the ``mmap.mmap`` ``m`` maps no file (``mmap.mmap(-1, n)``): its
    ``size()`` asks the file it has none of. Needs no ``/proc``."""
    if type(m) is not mmap.mmap:
        return False
    try:
        if m.closed:
            return False
        m.size()
    except OSError:
        return True
    except Exception:
        return False
    return False


def travels(value):
    """An ``mmap.mmap`` the reducer sends to a worker: a named file's map that
    can be mapped again exactly, or an anonymous one shared through shared memory."""
    return map_reference(value)[0] is not None or (anonymous(value) and _shm_open() is not None)


def reduce_map(m):
    """ForkingPickler's reducer for ``mmap.mmap``: by reference while a process
    is being started; else (or where it cannot go exactly) the TypeError
    pickling raises, with why it was not sent."""
    if get_spawning_popen() is None:
        return m.__reduce_ex__(PROTOCOL)  # raises, as ever
    if anonymous(m):
        return _reduce_anonymous(m)
    ref, why = map_reference(m)
    if ref is None:
        raise TypeError("cannot pickle 'mmap.mmap' object (not mapped again in the worker: "
                        "%s)" % why)
    return map_again, ref.args()


# -- anonymous maps: one block of shared memory for the workers --------------------
#
# A forked worker shares an anonymous ``mmap.mmap(-1, n)`` with the parent
# (MAP_SHARED): the same bytes, its own position. A spawned worker can map
# only what has a name, so the parent copies the map's bytes into one block
# of POSIX shared memory (``multiprocessing.shared_memory``) and each worker
# of the iterator maps that block, with the parent's position and access:
# they share what they write among themselves, as forked workers do. What
# the parent writes into its own map once the workers have started is not
# seen by them (nor theirs by it): the assumption, as for a mapped file, is
# that the map is not written while the workers run. The block is reused
# while it holds the map's bytes, and unlinked with the map (or at exit).

_blocks: dict[int, Any] = {}  # id(map) -> SharedMemory holding its bytes


def _shm_open():
    try:
        import _posixshmem  # noqa: PLC0415 - POSIX only: absent on Windows
    except ImportError:  # Windows: named mappings, not done here
        return None
    return _posixshmem.shm_open


def _reduce_anonymous(m):
    from multiprocessing import shared_memory  # noqa: PLC0415 - only for an anonymous map

    length = len(m)
    if length == 0 or _shm_open() is None:
        raise TypeError("cannot pickle 'mmap.mmap' object (an empty anonymous map, or no "
                        "POSIX shared memory here)")
    from ..inspection.probe import is_probing  # noqa: PLC0415 - parent only: workers import this module too

    if is_probing():  # planning: nothing is made for a child that never starts
        return map_shared_block, ("/probe", length, m.tell(), _writable(m))
    block = _blocks.get(id(m))
    if block is None or block.buf[:length] != memoryview(m):
        block = shared_memory.SharedMemory(create=True, size=length)
        cast(memoryview, block.buf)[:length] = memoryview(m)  # None only once closed
        previous = _blocks.get(id(m))
        _blocks[id(m)] = block
        if previous is None:
            weakref.finalize(m, _unlink, id(m))
    return map_shared_block, ("/" + block.name, length, m.tell(), _writable(m))


def _writable(m):
    try:
        m.write(b"")  # ACCESS_READ refuses any write; nothing is written otherwise
    except TypeError:
        return False
    return True


def _unlink(key):
    block = _blocks.pop(key, None)
    if block is not None:
        try:
            block.close()
            block.unlink()
        except Exception:
            pass


def map_shared_block(name, length, position, writable):
    """In a worker: the anonymous map, as one block shared with the other workers."""
    try:
        fd = _shm_open()(name, os.O_RDWR if writable else os.O_RDONLY, mode=0o600)
    except OSError as exc:
        raise MappedFileChanged("the shared memory holding an anonymous map is gone (%s): "
                                "this worker cannot have its bytes (DL201)" % exc) from exc
    try:
        m = mmap.mmap(fd, length, access=mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ)
    finally:
        os.close(fd)
    m.seek(position)
    return m


def map_reducers():
    return {mmap.mmap: reduce_map}


def size_text(nbytes):
    """``300 MiB``, ``12 KiB``, ``5 bytes``."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= size:
            value = nbytes / size
            return ("%.0f %s" if value >= 10 else "%.1f %s") % (value, unit)
    return "%d bytes" % nbytes
