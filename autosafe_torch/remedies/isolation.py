"""Fork: each worker gets its own file offsets, and its own native handles.

Forked workers share every inherited descriptor's open file description,
and so its offset: a dataset that seeks then reads a file opened in
``__init__`` returns a sibling's bytes, and a GzipFile or ZipFile above it
breaks. Isolate, don't reconstruct: in each forked worker, every read-only
regular-file descriptor the loader's parts reach is given an open file
description of its own, at the offset it had at fork, under the same
descriptor number (open the same file again, seek, ``dup2`` over it).
Every Python object above it keeps its state (newline mode, buffers, a
ZipFile's directory, a GzipFile's decompressor), whatever its type.

A descriptor open for writing stays shared, as it is without the shim (the
record says so). Native handles that hold no descriptor of theirs to give
(h5py, sqlite, lmdb, ``cv2.VideoCapture``) are reopened by path in each
worker (``reopen``).

One check decides and acts: ``plan`` (what the rules read to choose the fork
rung) and the worker step use the same functions, ``can_isolate`` and
``reopen.fork_reopen_args``. What a worker cannot handle when it acts (the
file vanished meanwhile, a handle that cannot be reopened) is never left in
place: the worker raises ``RemedyFailed``, and recovery steps down (DL216).
"""

import functools
import os
import sys

from ..inspection import holdings
from ..inspection.descriptors import READ_ONLY, find_descriptors, path_of
from ..inspection.failures import RemedyFailed
from . import reopen

PARTS = ("dataset", "collate_fn", "worker_init_fn")


# -- one descriptor -------------------------------------------------------------

def reopen_descriptor(fd, dev, ino):
    """A new open file description of the file open on ``fd``, read-only, with
    the same status flags; checked to be the same file. Raises OSError."""
    import fcntl

    if sys.platform.startswith("linux"):
        path = "/proc/self/fd/%d" % fd  # reaches the file even if it was renamed or deleted
    else:
        path = path_of(fd)  # macOS: fcntl(F_GETPATH)
        if path is None:
            raise OSError("its path cannot be read back")
    new = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        st = os.fstat(new)
        if (st.st_dev, st.st_ino) != (dev, ino):
            raise OSError("another file is at its path now")
        fcntl.fcntl(new, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL))
    except BaseException:
        os.close(new)
        raise
    return new


def can_isolate(found):
    """None when ``found`` (a read-only ``HeldDescriptor``) can be given its
    own offset in a worker; else why not. Tried for real, and undone."""
    try:
        os.close(reopen_descriptor(found.fd, found.dev, found.ino))
    except (OSError, ImportError) as exc:
        return _reason(exc)
    return None


def isolate(fd, dev, ino, offset):
    """Put a description of its own, at ``offset``, under ``fd``."""
    new = reopen_descriptor(fd, dev, ino)
    try:
        os.lseek(new, offset, os.SEEK_SET)
        os.dup2(new, fd, inheritable=os.get_inheritable(fd))
    finally:
        os.close(new)


def _reason(exc):
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)


# -- the plan: what fork means for a loader's parts -----------------------------

class ForkPlan:
    """What forked workers of a loader would share, and what is done about it.

    ``isolate``: read-only regular-file descriptors (``HeldDescriptor``), each
    given its own offset; ``shared``: descriptors open for writing, left
    shared; ``handles``: ``(HeldFile, reopen args, note)`` native handles
    reopened by path; ``unhandled``: ``(path, why, fork_unsafe)`` that
    nothing here can handle (the fork rung must not be chosen for them;
    ``fork_unsafe`` names a handle a forked child must not use, else None).
    """

    __slots__ = ("isolate", "shared", "handles", "unhandled")

    def __init__(self):
        self.isolate, self.shared, self.handles, self.unhandled = [], [], [], []

    def __bool__(self):
        return bool(self.isolate or self.handles or self.unhandled)


def parts_of(args):
    """The loader's parts a forked worker uses: the dataset, collate_fn and the
    user's own worker_init_fn (ours adds no files)."""
    from .workerinit import user_function

    return {"dataset": args["dataset"], "collate_fn": args["collate_fn"],
            "worker_init_fn": user_function(args["worker_init_fn"])}


def plan(parts, items=None):
    """The ``ForkPlan`` for ``parts`` (``{name: object}``). ``items``: look at
    that many items per container (``objwalk.SAMPLE_ITEMS`` to decide, None to act)."""
    result = ForkPlan()
    for found in find_descriptors(parts, items):
        if not found.shared_offset:
            continue  # a pipe, a socket, a terminal: no offset of ours to keep
        if found.access != READ_ONLY:
            result.shared.append(found)
            continue
        why = can_isolate(found)
        if why is None:
            result.isolate.append(found)
        else:
            result.unhandled.append((found.describe(), "cannot be reopened (%s)" % why, None))
    for name, part in parts.items():
        if part is None:
            continue
        for found in holdings.find_files(part, name, items=items):
            if not holdings.is_native_handle(found.obj):
                continue  # a file object: its descriptor is isolated above
            args, why, note = reopen.fork_reopen_args(found)
            if args is None:
                if why is not None:
                    result.unhandled.append((found.path, why, found.fork_unsafe))
            else:
                result.handles.append((found, args, note))
    return result


# -- the record taken as workers fork, and the worker step -----------------------

class ForkRecord:
    """What the forked workers of one loader isolate: taken in the parent as
    each iterator starts (the offsets at fork), read by each worker's first
    step (it inherits this object). Pickled (a loader moved to spawn), it
    arrives empty: a spawned worker inherits no descriptor."""

    def __init__(self):
        self.pid = None
        self.descriptors = ()
        self.handles = ()
        self.unhandled = ()

    def __reduce__(self):
        return ForkRecord, ()

    def __repr__(self):
        return "own offsets and handles in each forked worker"

    def take(self, loader):
        """In the parent, just before its workers fork. Never fails: what it
        cannot take, the workers report (they never run with it shared)."""
        try:
            args = {name: getattr(loader, name) for name in PARTS}
            found = plan(parts_of(args))
            descriptors = []
            for d in found.isolate:
                try:
                    offset = os.lseek(d.fd, 0, os.SEEK_CUR)
                except OSError as exc:
                    found.unhandled.append((d.describe(), _reason(exc), None))
                    continue
                descriptors.append((d.fd, d.dev, d.ino, offset, d))
            self.descriptors = tuple(descriptors)
            self.handles = tuple((held, args) for held, args, _note in found.handles)
            self.unhandled = tuple(found.unhandled)
        except Exception as exc:  # ours: the workers step down rather than share
            self.descriptors = self.handles = ()
            self.unhandled = (("the dataset's files", "could not be looked at (%s: %s)"
                               % (type(exc).__name__, exc), None),)
        self.pid = os.getpid()


def isolate_in_worker(record, worker_id):
    """Worker step (first of all): own offsets, own handles; ``RemedyFailed``
    for anything that cannot be given its own."""
    if record.pid is None or os.getppid() != record.pid:
        return  # an emulated worker (this process), or one not forked from the recorder
    if record.unhandled:
        raise RemedyFailed("not given its own in worker %d: %s" % (worker_id, "; ".join(
            "%s %s" % (path, why) for path, why, _kind in record.unhandled)))
    for fd, dev, ino, offset, found in record.descriptors:
        try:
            isolate(fd, dev, ino, offset)
        except OSError as exc:
            raise RemedyFailed("%s could not be given its own offset in worker %d (%s)"
                               % (found.describe(), worker_id, _reason(exc))) from None
    for held, args in record.handles:
        try:
            reopen.reopen_in_forked_worker(held, args)
        except Exception as exc:
            raise RemedyFailed("%s could not be reopened in worker %d (%s: %s)"
                               % (held.path, worker_id, type(exc).__name__, exc)) from None


def worker_step(record):
    return functools.partial(isolate_in_worker, record)


def record_of(worker_init_fn):
    """The ``ForkRecord`` of the isolation step inside ``worker_init_fn``, or None."""
    from .workerinit import steps_of

    for step in steps_of(worker_init_fn):
        if isinstance(step, functools.partial) and step.func is isolate_in_worker:
            return step.args[0]
    return None

