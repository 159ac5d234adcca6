"""Reopen read-only files by path: in a spawned worker, or in each forked one.

- A read-only regular file does not pickle, but it can travel by path: the
  reducers installed here reopen it in the receiving process at the same
  offset, with the same mode, encoding, errors and newline. Anything else
  (written files, pipes, sockets, closed or deleted files) still raises the
  TypeError it always did, so nothing whose state cannot be duplicated is
  duplicated.
- Under fork the dataset is not pickled, but every worker shares one OS file
  offset with the parent and its siblings: a dataset that seeks then reads
  returns other samples' bytes. ``reopen_files_in_worker`` gives each worker
  its own file.
"""

import io
import sys
import weakref

from ..inspection.holdings import (READONLY, file_kind, find_files, h5py_types, raw_file,
                                   real_path, sqlite_path)
from .pickling import PROTOCOL, install

# -- reopening by path ----------------------------------------------------------


def _reopen_args(f):
    """What ``_reopen_file`` needs to open ``f`` again where it is, or None."""
    if file_kind(f) != READONLY:
        return None
    h5 = h5py_types()
    if h5 and isinstance(f, h5):
        return ("h5py", f.file.filename, f.name, isinstance(f, sys.modules["h5py"].File))
    database = sqlite_path(f)
    if database is not None:
        return ("sqlite", database, f.row_factory, f.text_factory)
    path = real_path(raw_file(f))
    try:
        offset = f.tell()  # a text file iterated with next() refuses: not now
    except (OSError, ValueError):
        return None
    if isinstance(f, io.TextIOWrapper):
        # Its newline argument cannot be read back; it changes nothing where the
        # file holds no carriage return. Where it does, not reopened (CRLF could
        # silently read as LF).
        if not _no_carriage_return(path):
            return None
        return ("text", path, offset, f.encoding, f.errors)
    return ("raw" if isinstance(f, io.FileIO) else "binary", path, offset)


def _no_carriage_return(path):
    import mmap

    with open(path, "rb") as raw:
        try:
            with mmap.mmap(raw.fileno(), 0, access=mmap.ACCESS_READ) as view:
                return view.find(b"\r") == -1
        except ValueError:  # an empty file
            return True


def _reopen_file(kind, *args):
    """Runs where the file arrives (a worker): the same file, at the same place."""
    if kind == "sqlite":
        import sqlite3
        import urllib.parse

        path, row_factory, text_factory = args
        conn = sqlite3.connect("file:%s?mode=ro" % urllib.parse.quote(path), uri=True)
        conn.row_factory, conn.text_factory = row_factory, text_factory
        return conn
    if kind == "h5py":
        import h5py

        filename, name, whole = args
        f = h5py.File(filename, "r")
        return f if whole else f[name]
    path, offset = args[0], args[1]
    if kind == "raw":
        f = io.FileIO(path, "r")
    elif kind == "binary":
        f = open(path, "rb")
    else:
        f = open(path, "r", encoding=args[2], errors=args[3])
    f.seek(offset)
    return f


def reopen(f, offset=None):
    """A new file object on the same file, at ``offset`` (default: where ``f`` is)."""
    args = _reopen_args(f)
    if args is None:
        raise ValueError("not a read-only regular file: %r" % (f,))
    if offset is not None and args[0] not in ("h5py", "sqlite"):
        args = args[:2] + (offset,) + args[3:]
    return _reopen_file(*args)


def _reduce_file(f):
    args = _reopen_args(f)
    if args is None:
        return f.__reduce_ex__(PROTOCOL)  # raises the very error it raised before us
    return _reopen_file, args


def file_reducers():
    """The reducers that let read-only files (h5py objects, sqlite connections)
    travel by path."""
    sqlite3 = sys.modules.get("sqlite3")
    return {cls: _reduce_file for cls in (io.FileIO, io.BufferedReader, io.TextIOWrapper)
            + h5py_types() + ((sqlite3.Connection,) if sqlite3 else ())}


def install_reducers():
    """Let read-only files (and h5py objects, if h5py is imported) travel by path.

    Idempotent; call again after h5py is imported to cover it too.
    """
    install(file_reducers())


# -- per-worker reopening -------------------------------------------------------

_parent_offsets = {}  # id(file) -> (weakref to it, offset)


def remember_file_offsets(obj, path="dataset"):
    """Record, in the parent, where each read-only file stands before forking.

    Forked workers share the OS offset, so a worker that starts late would
    read a sibling's position with tell(); it uses the recorded one instead.
    """
    for found in find_files(obj, path):
        if found.kind == READONLY and not isinstance(found.obj, h5py_types() or ()):
            try:
                _parent_offsets[id(found.obj)] = (weakref.ref(found.obj), found.obj.tell())
            except (OSError, ValueError, TypeError):
                pass


def reopen_files(obj, path="dataset"):
    """Replace each read-only file reachable from ``obj`` by a fresh one, in place.

    Returns the paths replaced. A file held only in a tuple cannot be replaced
    and is left as it is. The old file objects are not closed: something
    outside ``obj`` may still use them.
    """
    fresh, replaced = {}, []
    for found in find_files(obj, path):
        if found.kind != READONLY or not found.settable:
            continue
        old = found.obj
        if id(old) not in fresh:
            remembered = _parent_offsets.get(id(old))
            offset = remembered[1] if remembered and remembered[0]() is old else None
            try:
                fresh[id(old)] = reopen(old, offset)
            except (OSError, ValueError):
                continue
        found.set(fresh[id(old)])
        replaced.append(found.path)
    return replaced


def reopen_files_in_worker(worker_id):
    """A worker_init step: this worker's own copy of every read-only file of its dataset."""
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    if info is not None:
        reopen_files(info.dataset)
