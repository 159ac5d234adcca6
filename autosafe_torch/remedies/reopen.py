"""Reopen read-only files by path: in a spawned worker, or in each forked one.
Files include the native handles ``holdings.file_kind`` knows (h5py, read-only
sqlite and lmdb: no position; a ``cv2.VideoCapture`` of a file: at its frame).

- A read-only file does not pickle, but travels by path: reopened where it
  arrives at the same offset, mode, encoding, errors and newline. Anything
  else (written files, pipes, sockets, closed or deleted files) still raises
  its TypeError: nothing whose state cannot be duplicated is duplicated.
- Under fork a plain file keeps its object (``isolation`` gives it its own
  offset); a native handle (sqlite, lmdb, a capture) is reopened in each
  worker, from arguments taken at fork.
"""

from __future__ import annotations

import contextlib
import gc
import io
import mmap
import sys
from typing import Any
import urllib.parse

from ..inspection.holdings import (LMDB, LMDB_ENV, READONLY, VIDEO, file_kind, fork_unsafe,
                                   h5py_types, loaded, raw_file, real_path, sqlite_path,
                                   video_source)
from .pickling import PROTOCOL, install


def _reopen_args(f):
    """What ``_reopen_file`` needs to open ``f`` again where it is, or None."""
    if file_kind(f) != READONLY:
        return None
    if isinstance(f, h5py_types()):
        return ("h5py", f.file.filename, f.name, isinstance(f, sys.modules["h5py"].File))
    if (database := sqlite_path(f)) is not None:
        return ("sqlite", database, f.row_factory, f.text_factory)
    handle = fork_unsafe(f)
    if handle == LMDB_ENV:
        return ("lmdb", f.path(), _lmdb_options(f))
    if handle == VIDEO:
        source, api, params = video_source(f)
        frame = None
        with contextlib.suppress(Exception):
            frame = f.get(sys.modules["cv2"].CAP_PROP_POS_FRAMES)
        return ("video", source, frame, api, params)
    path = real_path(raw_file(f))
    try:
        offset = f.tell()  # a text file iterated with next() refuses: not now
    except (OSError, ValueError):
        return None
    if isinstance(f, io.TextIOWrapper):
        # Its newline argument cannot be read back; it changes nothing where the
        # file holds no CR and lines end at LF. Else not reopened: CRLF could read as LF.
        if not _no_carriage_return(path) or not _lines_end_at_lf(f):
            return None
        return ("file", path, offset, "r", -1, f.encoding, f.errors)
    return ("file", path, offset, "rb", 0 if isinstance(f, io.FileIO) else -1)


def _lmdb_options(env):
    options = {k: v for k, v in env.flags().items() if k != "readonly"}
    info = env.info()
    # max_dbs cannot be read back: room for every named database there is.
    options.update(readonly=True, create=False, map_size=info["map_size"],
                   max_readers=info["max_readers"], max_dbs=len(env.dbs()))
    return options


def _no_carriage_return(path):
    with open(path, "rb") as raw:
        try:
            with mmap.mmap(raw.fileno(), 0, access=mmap.ACCESS_READ) as view:
                return view.find(b"\r") == -1
        except ValueError:  # an empty file
            return True


def _lines_end_at_lf(f):
    """Whether text file ``f`` (holding no CR) ends lines at LF, as the reopened
    file will: a wrapper opened with ``newline='\r'`` or ``'\r\n'`` keeps that
    very string, which CPython's wrapper lists among its references (no other
    string it holds can be one of those, in a file with no CR)."""
    if sys.implementation.name != "cpython":
        return False
    return not any(type(r) is str and r in ("\r", "\r\n") for r in gc.get_referents(f))


def _reopen_file(kind, *args):
    """Runs where the file arrives (a worker): the same file, at the same place."""
    if kind == "sqlite":
        import sqlite3  # noqa: PLC0415 - holdings.sqlite_path and file_reducers read sqlite3 in sys.modules as "the program uses it"

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
    path, offset, *how = args  # open()'s mode, buffering (0: a FileIO), encoding, errors
    f = open(path, *how)  # noqa: SIM115 - the reopened file is what this returns
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
    """Reducers that let read-only files and native handles (where imported) travel by path."""
    native = (loaded(module, name) for module, name in (
        ("sqlite3", "Connection"), ("lmdb", "Environment"), ("cv2", "VideoCapture")))
    return {cls: _reduce_file for cls in (io.FileIO, io.BufferedReader, io.TextIOWrapper,
                                          *h5py_types(), *native) if isinstance(cls, type)}


def install_reducers():
    """Install ``file_reducers``: idempotent; again after h5py, sqlite3, lmdb or cv2 is imported."""
    install(file_reducers())


# -- native handles in forked workers ----------------------------------------------

def read_only_note(f):
    """The log's note on a handle reopened read-only that may have been writable."""
    if sqlite_path(f) is not None:
        return "reopened read-only (mode=ro): a write in a worker fails"
    with contextlib.suppress(Exception):  # py-lmdb opens read-write by default
        if fork_unsafe(f) == LMDB_ENV and not f.flags()["readonly"]:
            return "opened read-write, reopened read-only: a write in a worker fails"
    return None


_inherited: list[Any] = []  # a forked worker's copies of the parent's captures: never released


def reopen_in_forked_worker(found, args):
    """In a forked worker: ``found``'s own handle, opened with ``args``, put
    where the inherited one hangs. An lmdb environment is closed first (py-lmdb
    opens one once per process; LMDB forbids the parent's in a child anyway);
    a capture is kept alive (releasing one joins decoder threads the child
    does not have, and hangs)."""
    handle = fork_unsafe(found.obj)
    if handle in LMDB:
        found.obj.close()
    elif handle:
        _inherited.append(found.obj)
    found.set(_reopen_file(*args))
