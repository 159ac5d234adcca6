"""Memory maps sent to spawn/forkserver workers by reference: numpy memmaps
(DL218) and ``mmap.mmap`` objects (DL201); ``inspection/mappings.py`` finds
what can go and where its bytes lie.

A pickled ``numpy.memmap`` copies its data into every worker start (the
costs: DL218's rule) and arrives a writable, contiguous ``np.memmap`` whose
``_mmap``, ``filename``, ``offset`` and ``mode`` are None. Sent instead: the
file, offset, shape, dtype and order; the worker maps the file again
copy-on-write (``ACCESS_COPY``: writable and private, as that copy is) as
such an ``np.memmap`` (its ``base`` the map). Exact or nothing
(``mappings.reference`` says why not): a ``mode='c'`` map, a deleted or
replaced file, every array without ``/proc/self/maps`` are pickled.

Assumed (the rule's docs): the file does not change while the workers start
and run (the parent's writes through an ``r+``/``w+`` map are in the page
cache the worker maps); else the worker fails loudly (``MappedFileChanged``:
the record says the fix did not hold, recovery takes over). Only while a
process is being started (``get_spawning_popen()``): a memmap put on a queue
later is pickled as before.

An ``mmap.mmap`` does not pickle at all: the baseline is the parent's map as
a forked worker holds it. The worker maps the same range of the same file
again, with its access and position; a shared map shows the page cache, so
the file need only be the same (device, inode). A private map goes only
while the parent wrote none of its pages (``Anonymous: 0 kB`` in
``/proc/self/smaps``). What does not go leaves the DL201 ladder to go on; an
anonymous map goes through shared memory.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import weakref
from multiprocessing.context import get_spawning_popen
from typing import Any, cast

from ..inspection.mappings import _shm_open, anonymous, map_reference, reference, writable
from .pickling import PROTOCOL, install


class MappedFileChanged(RuntimeError):
    """In a worker: the file a memmap was sent by reference from is gone or changed."""


def map_file(path, ident, start, length, access, rule, changed):
    """In a worker: ``length`` bytes (0: to the end) of ``path`` from ``start``,
    where it is still the file ``ident`` names (device, inode; mtime and size
    where given) and long enough (checked on the descriptor mapped)."""
    write = access == mmap.ACCESS_WRITE
    try:
        fd = os.open(path, (os.O_RDWR if write else os.O_RDONLY) | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)[:len(ident)] != tuple(ident) \
                    or st.st_size < start + length:
                raise MappedFileChanged("%s %s (%s): this worker cannot map the data it was "
                                        "sent" % (path, changed, rule))
            return mmap.mmap(fd, length, access=access, offset=start)
        finally:
            os.close(fd)
    except OSError as exc:
        raise MappedFileChanged("%s cannot be mapped again in this worker (%s): %s"
                                % (path, rule, exc)) from exc


def mapped_again(path, ident, start, length, delta, shape, dtype, order):
    import numpy as np  # noqa: PLC0415 - optional dependency

    mm = map_file(path, ident, start, length, mmap.ACCESS_COPY, "DL218",
                  "changed after the training process sent its memmap by reference")
    # Built as pickling builds it: memmap's __array_finalize__ sees no memmap
    # and sets _mmap, filename, offset and mode to None.
    return np.ndarray.__new__(np.memmap, shape, dtype=dtype, buffer=mm, offset=delta,
                              order=order)


def reduce_memmap(arr):
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


def map_again(path, ident, start, length, how, position):
    """In a worker (or for an emulated worker's copy): the map a forked worker holds."""
    m = map_file(path, ident, start, length, ACCESS[how], "DL201",
                 "is not the file the training process mapped")
    m.seek(position)
    return m


def reduce_map(m):
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
# A forked worker shares an anonymous ``mmap.mmap(-1, n)`` with the parent
# (MAP_SHARED); a spawned one maps only what has a name: one block of POSIX shared
# memory holding the map's bytes, with the parent's position and access, so the
# workers share their writes as forked ones do (the parent's after they start
# are not seen: the map is assumed not written meanwhile, as a file is). The
# block is reused while it holds the map's bytes, unlinked with the map (or at exit).

_blocks: dict[int, Any] = {}  # id(map) -> SharedMemory holding its bytes


def _reduce_anonymous(m):
    from multiprocessing import shared_memory  # noqa: PLC0415 - 0.5 ms in each worker that unpickles a map, which imports this module (-X importtime after torch: multiprocessing.shared_memory, hmac, secrets)

    length = len(m)
    if length == 0 or _shm_open() is None:
        raise TypeError("cannot pickle 'mmap.mmap' object (an empty anonymous map, or no "
                        "POSIX shared memory here)")
    from ..inspection.probe import is_probing  # noqa: PLC0415 - 0.6 ms in each worker that unpickles a map, which imports this module (-X importtime after torch: inspection.probe, inventory)

    if is_probing():  # planning: nothing is made for a child that never starts
        return map_shared_block, ("/probe", length, m.tell(), writable(m))
    block = _blocks.get(id(m))
    if block is None or block.buf[:length] != memoryview(m):
        block = shared_memory.SharedMemory(create=True, size=length)
        cast(memoryview, block.buf)[:length] = memoryview(m)  # None only once closed
        if id(m) not in _blocks:
            weakref.finalize(m, _unlink, id(m))
        _blocks[id(m)] = block
    return map_shared_block, ("/" + block.name, length, m.tell(), writable(m))


def _unlink(key):
    block = _blocks.pop(key, None)
    if block is not None:
        with contextlib.suppress(Exception):
            block.close()
            block.unlink()


def map_shared_block(name, length, position, writable):
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
