"""Reopen read-only files by path: in a spawned worker, or in each forked one.

Files here include the native handles ``holdings.file_kind`` knows: h5py
objects, read-only sqlite connections and lmdb environments (no position),
and ``cv2.VideoCapture`` objects of a file (reopened at the same frame).

- A read-only regular file does not pickle, but it can travel by path: the
  reducers here reopen it in the receiving process at the same offset, with
  the same mode, encoding, errors and newline. Anything else (written files,
  pipes, sockets, closed or deleted files) still raises the TypeError it
  always did: nothing whose state cannot be duplicated is duplicated.
- Under fork the dataset is not pickled: a plain file keeps its object and
  gets its own offset (``isolation``); a native handle a forked child must
  not share (sqlite, lmdb, a capture) is reopened by path in each worker
  (``reopen_in_forked_worker``), from arguments taken at fork.
"""

from __future__ import annotations

import gc
import io
import mmap
import sys
from typing import Any
import urllib.parse

from ..inspection.holdings import (LMDB_ENV, READONLY, VIDEO, file_kind, fork_unsafe,
                                   h5py_types, lmdb_read_write, one_per_process, raw_file,
                                   real_path, sqlite_path, video_source)
from .pickling import PROTOCOL, install


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
    handle = fork_unsafe(f)
    if handle == LMDB_ENV:
        return ("lmdb", f.path(), _lmdb_options(f))
    if handle == VIDEO:
        source, api, params = video_source(f)
        return ("video", source, _frame(f), api, params)
    path = real_path(raw_file(f))
    try:
        offset = f.tell()  # a text file iterated with next() refuses: not now
    except (OSError, ValueError):
        return None
    if isinstance(f, io.TextIOWrapper):
        # Its newline argument cannot be read back; it changes nothing where the
        # file holds no carriage return and lines end at LF. Otherwise not
        # reopened (CRLF could silently read as LF): exact or nothing.
        if not _no_carriage_return(path) or not _lines_end_at_lf(f):
            return None
        return ("text", path, offset, f.encoding, f.errors)
    return ("raw" if isinstance(f, io.FileIO) else "binary", path, offset)


def _lmdb_options(env):
    options = {k: v for k, v in env.flags().items() if k != "readonly"}
    info = env.info()
    # max_dbs cannot be read back: room for every named database there is.
    options.update(readonly=True, create=False, map_size=info["map_size"],
                   max_readers=info["max_readers"], max_dbs=len(env.dbs()))
    return options


def _frame(capture):
    """A capture's next frame, or None."""
    try:
        return capture.get(sys.modules["cv2"].CAP_PROP_POS_FRAMES)
    except Exception:
        return None


def _no_carriage_return(path):
    with open(path, "rb") as raw:
        try:
            with mmap.mmap(raw.fileno(), 0, access=mmap.ACCESS_READ) as view:
                return view.find(b"\r") == -1
        except ValueError:  # an empty file
            return True


def _lines_end_at_lf(f):
    """Whether text file ``f`` ends lines at LF, as the reopened file will
    (``newline=None``, ``''`` or ``'\n'``), on a file holding no carriage
    return. A wrapper opened with ``newline='\r'`` or ``'\r\n'`` keeps that
    very string, and CPython's wrapper lists it among its references; in a
    file with no CR no other string it holds can be one of those."""
    if sys.implementation.name != "cpython":
        return False
    return not any(type(r) is str and r in ("\r", "\r\n") for r in gc.get_referents(f))


def _reopen_file(kind, *args):
    """Runs where the file arrives (a worker): the same file, at the same place."""
    if kind == "sqlite":
        import sqlite3  # noqa: PLC0415 - holdings.sqlite_path and _native_types read sqlite3 in sys.modules as "the program uses it"

        path, row_factory, text_factory = args
        conn = sqlite3.connect("file:%s?mode=ro" % urllib.parse.quote(path), uri=True)
        conn.row_factory, conn.text_factory = row_factory, text_factory
        return conn
    if kind == "lmdb":
        import lmdb  # noqa: PLC0415 - optional dependency

        path, options = args
        return lmdb.open(path, **options)
    if kind == "video":
        import cv2  # noqa: PLC0415 - optional dependency

        source, frame, api, params = args
        cap = cv2.VideoCapture(source, api, list(params)) if params \
            else cv2.VideoCapture(source, api)
        cap.set(cv2.CAP_PROP_POS_FRAMES, frame)
        return cap
    if kind == "h5py":
        import h5py  # noqa: PLC0415 - optional dependency

        filename, name, whole = args
        f = h5py.File(filename, "r")
        return f if whole else f[name]
    path, offset = args[0], args[1]
    if kind == "raw":
        f = io.FileIO(path, "r")
    elif kind == "binary":
        f = open(path, "rb")  # noqa: SIM115 - the reopened file is what this returns
    else:
        f = open(path, encoding=args[2], errors=args[3])  # noqa: SIM115 - returned, as above
    f.seek(offset)
    return f


def reopen(f):
    """A new file object on the same file, where ``f`` is."""
    args = _reopen_args(f)
    if args is None:
        raise ValueError("not a read-only regular file: %r" % (f,))
    return _reopen_file(*args)


def _reduce_file(f):
    args = _reopen_args(f)
    if args is None:
        return f.__reduce_ex__(PROTOCOL)  # raises the very error it raised before us
    return _reopen_file, args


def file_reducers():
    """The reducers that let read-only files and native handles travel by path."""
    return {cls: _reduce_file for cls in (io.FileIO, io.BufferedReader, io.TextIOWrapper)
            + h5py_types() + _native_types()}


def _native_types():
    """sqlite3.Connection, lmdb.Environment and cv2.VideoCapture, where imported."""
    return tuple(cls for module, name in (("sqlite3", "Connection"), ("lmdb", "Environment"),
                                          ("cv2", "VideoCapture"))
                 for cls in [getattr(sys.modules.get(module), name, None)]
                 if isinstance(cls, type))


def install_reducers():
    """Install ``file_reducers``: idempotent; call again after h5py, sqlite3,
    lmdb or cv2 is imported to cover it too."""
    install(file_reducers())


# -- native handles in forked workers ----------------------------------------------

def read_only_note(f):
    """What the log says of a handle reopened read-only that may have been
    opened for writing (a sqlite connection, an lmdb environment), or None."""
    if sqlite_path(f) is not None:
        return "reopened read-only (mode=ro): a write in a worker fails"
    if fork_unsafe(f) == LMDB_ENV and lmdb_read_write(f):
        return "opened read-write, reopened read-only: a write in a worker fails"
    return None


_inherited: list[Any] = []  # a forked worker's copies of the parent's captures: never released


def reopen_in_forked_worker(found, args):
    """In a forked worker: ``found``'s own handle, opened with ``args`` (taken
    in the parent at fork), put where the inherited one hangs. An lmdb
    environment is closed first (py-lmdb refuses to open one twice in a
    process; LMDB forbids the parent's in a child anyway); a capture is kept
    alive (releasing one joins decoder threads the child does not have, and
    hangs)."""
    old = found.obj
    if one_per_process(old):
        old.close()
    elif fork_unsafe(old):
        _inherited.append(old)
    found.set(_reopen_file(*args))
