"""This process's file mappings (``/proc/self/maps``, ``/proc/self/smaps``),
and where the bytes of a numpy memmap or an ``mmap.mmap`` lie in them: the
references ``remedies/memmaps.py`` sends to workers (a tensor's:
``tensors.reference``). Exact or nothing: where an object cannot go, each
says why not. A Mac rehearsed with ``--as macos`` has no ``/proc/self/maps``.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import ctypes
import functools
import mmap
import os
import stat

from .. import rehearsal

MAPS = "/proc/self/maps"
SMAPS = "/proc/self/smaps"
# What /proc/self/maps names shared anonymous memory by ("... (deleted)").
_ANONYMOUS = ("/dev/zero", "/memfd:", "/SYSV")


class Mapping(collections.namedtuple("Mapping", "start end perms offset device inode path")):
    """One line of ``/proc/self/maps`` (``perms``: ``r--s``, ``rw-p``...)."""

    __slots__ = ()

    @property
    def shared(self):
        return self.perms[3:4] == "s"


def read_maps():
    """The file mappings ``/proc/self/maps`` lists, or None where it cannot be read."""
    try:
        with open(MAPS, "rb") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    found = []
    for line in lines:
        fields = line.split(None, 5)
        if len(fields) < 6 or not fields[5].startswith(b"/"):
            continue  # anonymous, heap, stack, [vdso]
        try:
            start, end = (int(x, 16) for x in fields[0].split(b"-"))
            major, minor = (int(x, 16) for x in fields[3].split(b":"))
            found.append(Mapping(start, end, fields[1].decode(), int(fields[2], 16),
                                 os.makedev(major, minor), int(fields[4]),
                                 os.fsdecode(fields[5])))
        except ValueError:
            continue
    return found


def mapped_file(address, nbytes, maps):
    """``(Mapping, os.stat_result, None)`` where the ``nbytes`` at ``address``
    lie in one mapping of a regular file still at its path, long enough; else
    ``(None, None, why not)``."""
    where = maps.holding(address)
    if where is None:
        return None, None, "its data are not in a file mapping"
    if address + nbytes > where.end:
        return None, None, "its data span more than one mapping"
    if where.path.endswith(" (deleted)"):
        return None, None, ("an anonymous map" if where.path.startswith(_ANONYMOUS)
                            else "its file was deleted")
    try:
        st = os.stat(where.path)
    except OSError as exc:
        return None, None, "its file is gone (%s)" % type(exc).__name__
    if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (where.device, where.inode):
        return None, None, "the file at its path is not the one mapped"
    if where.offset + (address - where.start) + nbytes > st.st_size:
        return None, None, "the file is shorter than the map"
    return where, st, None


class Maps:
    """This process's file mappings (None: no ``/proc/self/maps``, or the
    platform the rules see has none), sorted to find an address's by
    bisection (a dataset may hold many tensors); ``mappings=()``: read here."""

    __slots__ = ("mappings", "starts", "written")

    def __init__(self, mappings=()):
        if mappings == ():
            mappings = read_maps() if rehearsal.platform().startswith("linux") else None
        self.mappings = None if mappings is None else sorted(mappings, key=lambda m: m.start)
        self.starts = [m.start for m in self.mappings or ()]
        self.written = {}

    def holding(self, address):
        """The file mapping ``address`` lies in, or None."""
        i = bisect.bisect_right(self.starts, address) - 1
        if i >= 0 and self.mappings and address < self.mappings[i].end:
            return self.mappings[i]
        return None

    def written_to(self, where):
        """Kilobytes of the mapping ``where`` this process wrote (copied from
        the file: ``Anonymous`` in ``/proc/self/smaps``), looked up once; None
        if unknown."""
        if where.start not in self.written:
            self.written[where.start] = None
            header = "%x-%x " % (where.start, where.end)
            with contextlib.suppress(OSError, ValueError, IndexError), open(SMAPS) as f:
                inside = False
                for line in f:
                    if inside and line.startswith("Anonymous:"):
                        self.written[where.start] = int(line.split()[1])
                        break
                    if line[:1] in "0123456789abcdef" and "-" in line.split(" ", 1)[0]:
                        inside = line.startswith(header)
        return self.written[where.start]


# -- numpy memmaps (DL218) ----------------------------------------------------------

class Reference(collections.namedtuple(
        "Reference", "path ident start length delta shape dtype order")):
    """What a worker needs to map an array again (``ident``: device, inode,
    mtime in ns; ``start``: a multiple of ``mmap.ALLOCATIONGRANULARITY``;
    ``delta``: where the data begin in the map)."""

    __slots__ = ()

    def args(self):
        return tuple(self)


def reference(arr, maps=()):
    """``(Reference, None)`` where ``arr`` (an ``np.memmap``) can travel by
    reference exactly, else ``(None, why not)``."""
    maps = maps if isinstance(maps, Maps) else Maps(maps)
    if maps.mappings is None:
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
    where, st, why = mapped_file(address, nbytes, maps)
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


# -- mmap.mmap (DL201) -------------------------------------------------------------

class MapReference(collections.namedtuple(
        "MapReference", "path ident start length how position")):
    """What a worker needs to map an ``mmap.mmap`` again (``ident``: device
    and inode; ``how``: a key of ``memmaps.ACCESS``)."""

    __slots__ = ()

    def args(self):
        return tuple(self)


def map_reference(m, maps=()):
    """``(MapReference, None)`` where the ``mmap.mmap`` ``m`` maps a named file
    that a worker can map again exactly, else ``(None, why not)``."""
    if type(m) is not mmap.mmap:  # the type the reducer is registered for
        return None, "not an mmap.mmap"
    if anonymous(m):
        return None, "an anonymous map (it has no file to map again)"
    maps = maps if isinstance(maps, Maps) else Maps(maps)
    if maps.mappings is None:
        return None, "no %s here to find the mapped file" % MAPS
    try:
        if m.closed:
            return None, "closed"
        address, length = buffer_address(m)
        position = m.tell()
    except Exception as exc:  # not what it seems: leave it as it is
        return None, type(exc).__name__
    where, st, why = mapped_file(address, length, maps)
    if where is None:
        return None, "an anonymous map" if why.endswith("not in a file mapping") else why
    how = _access(m, where)
    if how is None:
        return None, "a map made with prot/flags (%s) that is not rebuilt" % where.perms
    if how == "copy" and maps.written_to(where) != 0:
        return None, "a private (ACCESS_COPY) map this process wrote to: its changes are in no file"
    return MapReference(where.path, (st.st_dev, st.st_ino),
                        where.offset + (address - where.start), length, how, position), None


def writable(m):
    try:
        m.write(b"")  # ACCESS_READ refuses any write; nothing is written otherwise
    except TypeError:
        return False
    return True


def _access(m, where):
    """The key of ``memmaps.ACCESS`` that maps as ``m`` is mapped, or None
    (prot=PROT_READ with ACCESS_DEFAULT, where a write would crash, or other);
    rw-s: ACCESS_WRITE, or ACCESS_DEFAULT on a file opened for writing."""
    if where.perms == "r--s" and not writable(m):
        return "read"
    return {"rw-s": "write", "rw-p": "copy"}.get(where.perms)


def buffer_address(obj):
    """``(address, length)`` of the memory ``obj`` exports."""
    api, struct = _buffer_api()
    view = struct()
    if api.PyObject_GetBuffer(obj, ctypes.byref(view), 0) != 0:
        raise BufferError("no buffer")
    try:
        return view.buf, view.len
    finally:
        api.PyBuffer_Release(ctypes.byref(view))


@functools.cache
def _buffer_api():
    """The C API's buffer functions and ``Py_buffer``, typed on a library
    handle of our own (``ctypes.pythonapi``'s functions are the user's to type)."""
    class PyBuffer(ctypes.Structure):  # Py_buffer, as the stable ABI defines it
        _fields_ = [("buf", ctypes.c_void_p), ("obj", ctypes.c_void_p),
                    ("len", ctypes.c_ssize_t), ("itemsize", ctypes.c_ssize_t),
                    ("readonly", ctypes.c_int), ("ndim", ctypes.c_int),
                    ("format", ctypes.c_char_p), ("shape", ctypes.c_void_p),
                    ("strides", ctypes.c_void_p), ("suboffsets", ctypes.c_void_p),
                    ("internal", ctypes.c_void_p)]

    api = ctypes.PyDLL(None)
    api.PyObject_GetBuffer.argtypes = [ctypes.py_object, ctypes.POINTER(PyBuffer), ctypes.c_int]
    api.PyObject_GetBuffer.restype = ctypes.c_int
    api.PyBuffer_Release.argtypes = [ctypes.POINTER(PyBuffer)]
    api.PyBuffer_Release.restype = None
    return api, PyBuffer


def anonymous(m):
    """Whether the ``mmap.mmap`` ``m`` maps no file (``mmap.mmap(-1, n)``):
    ``size()`` fails, asking the file it has none of. Needs no ``/proc``."""
    if type(m) is not mmap.mmap:
        return False
    try:
        if not m.closed:
            m.size()
    except OSError:
        return True
    except Exception:
        pass
    return False


def travels(value):
    """An ``mmap.mmap`` the reducer sends to a worker: a named file's map that
    can be mapped again exactly, or an anonymous one shared through shared memory."""
    return map_reference(value)[0] is not None or (anonymous(value) and _shm_open() is not None)


def _shm_open():
    try:
        import _posixshmem  # noqa: PLC0415 - POSIX only: absent on Windows
    except ImportError:  # Windows: named mappings, not done here
        return None
    return _posixshmem.shm_open
