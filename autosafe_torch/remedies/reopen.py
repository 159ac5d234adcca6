"""Reopen read-only files by path: in a spawned worker, or in each forked one.

Files here include the native handles ``holdings.file_kind`` knows: h5py
objects, read-only sqlite connections and lmdb environments (no position),
and ``cv2.VideoCapture`` objects of a file (reopened at the same frame).

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

from ..inspection.holdings import (LMDB_ENV, READONLY, VIDEO, file_kind, find_files,
                                   fork_unsafe, h5py_types, one_per_process, raw_file,
                                   real_path, sqlite_path, video_source)
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
    handle = fork_unsafe(f)
    if handle == LMDB_ENV:
        return ("lmdb", f.path(), _lmdb_options(f))
    if handle == VIDEO:
        source, api, params = video_source(f)
        return ("video", source, _position(f), api, params)
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


def _lmdb_options(env):
    """The ``lmdb.open`` arguments that matter to reading ``env`` again."""
    options = {k: v for k, v in env.flags().items() if k != "readonly"}
    info = env.info()
    # max_dbs cannot be read back: room for every named database there is.
    options.update(readonly=True, create=False, map_size=info["map_size"],
                   max_readers=info["max_readers"], max_dbs=len(env.dbs()))
    return options


def _position(f):
    """Where ``f`` stands (a byte offset, a capture's next frame), or None."""
    try:
        if fork_unsafe(f) == VIDEO:
            return f.get(sys.modules["cv2"].CAP_PROP_POS_FRAMES)
        return f.tell()
    except Exception:
        return None


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
    if kind == "lmdb":
        import lmdb

        path, options = args
        return lmdb.open(path, **options)
    if kind == "video":
        import cv2

        source, frame, api, params = args
        cap = cv2.VideoCapture(source, api, list(params)) if params \
            else cv2.VideoCapture(source, api)
        cap.set(cv2.CAP_PROP_POS_FRAMES, frame)
        return cap
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


_NO_POSITION = ("h5py", "sqlite", "lmdb")


def reopen(f, offset=None):
    """A new file object on the same file, at ``offset`` (default: where ``f`` is)."""
    args = _reopen_args(f)
    if args is None:
        raise ValueError("not a read-only regular file: %r" % (f,))
    if offset is not None and args[0] not in _NO_POSITION:
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
    return {cls: _reduce_file for cls in (io.FileIO, io.BufferedReader, io.TextIOWrapper)
            + h5py_types() + _native_types()}


def _native_types():
    """sqlite3.Connection, lmdb.Environment and cv2.VideoCapture, for the
    modules imported."""
    return tuple(cls for module, name in (("sqlite3", "Connection"), ("lmdb", "Environment"),
                                          ("cv2", "VideoCapture"))
                 for cls in [getattr(sys.modules.get(module), name, None)]
                 if isinstance(cls, type))


def install_reducers():
    """Let read-only files (and h5py, sqlite, lmdb and cv2 handles, for the
    modules imported) travel by path.

    Idempotent; call again after such a module is imported to cover it too.
    """
    install(file_reducers())


# -- per-worker reopening -------------------------------------------------------

_parent_args = {}  # id(file) -> (its type, a weak reference or None, its _reopen_args)


def remember_file_offsets(obj, path="dataset"):
    """Record, in the parent, how to reopen each read-only file before forking.

    Forked workers share the OS offset, so a worker that starts late would
    read a sibling's position with tell(); it uses the recorded one instead.
    A native handle is not asked anything in the child either (LMDB forbids
    using the parent's environment there; a capture's threads stayed behind).
    Called as each iterator starts, so the record is the position at fork.
    """
    for key, (_kind, ref, _args) in list(_parent_args.items()):
        if ref is not None and ref() is None:
            del _parent_args[key]
    for found in find_files(obj, path):
        if found.kind == READONLY:
            args = _reopen_args(found.obj)
            if args is not None:
                _parent_args[id(found.obj)] = (type(found.obj), _weak(found.obj), args)


def _weak(obj):
    """A weak reference, or None where the type refuses one (cv2.VideoCapture:
    then the id and type stand for it, as they do from the fork to the
    worker's first step)."""
    try:
        return weakref.ref(obj)
    except TypeError:
        return None


def _remembered(obj):
    kind, ref, args = _parent_args.get(id(obj), (None, None, None))
    if kind is type(obj) and (ref is None or ref() is obj):
        return args
    return None


_inherited = []  # a forked worker's copies of the parent's captures: never released


def reopen_files(obj, path="dataset", forked=False):
    """Replace each read-only file reachable from ``obj`` by a fresh one, in place.

    Returns the paths replaced. A file held only in a tuple cannot be replaced
    and is left as it is. The old file objects are not closed: something
    outside ``obj`` may still use them; but in a forked worker (``forked``)
    an lmdb environment is closed first: py-lmdb refuses to open one twice in
    a process, and LMDB forbids the parent's in a child anyway. Elsewhere an
    lmdb environment is left as it is. A forked worker keeps the parent's
    captures alive: releasing one joins decoder threads the child does not
    have, and hangs.
    """
    fresh, replaced = {}, []
    for found in find_files(obj, path):
        if found.kind != READONLY or not found.settable:
            continue
        old = found.obj
        if one_per_process(old) and not forked:
            continue
        if id(old) not in fresh:
            args = _remembered(old) or _reopen_args(old)
            if args is None:
                continue
            try:
                if one_per_process(old):
                    old.close()
                elif forked and fork_unsafe(old):
                    _inherited.append(old)
                fresh[id(old)] = _reopen_file(*args)
            except Exception:  # OSError, ValueError, lmdb.Error, cv2.error: left as it is
                continue
        found.set(fresh[id(old)])
        replaced.append(found.path)
    return replaced


def reopen_files_in_worker(worker_id):
    """A worker_init step: this worker's own copy of every read-only file of its dataset."""
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    if info is not None:
        reopen_files(info.dataset, forked=True)
