"""Every DataLoader worker gets a description of its own of each file the
training process holds open for reading, at the offset it had when the
workers started, under the same descriptor number: whoever holds it.

Forked workers share each inherited descriptor's open file description, so
its offset: a dataset that seeks then reads a file opened in ``__init__``
returns a sibling's bytes, and a GzipFile or ZipFile above it breaks. Any
object may hold the descriptor (``descriptors.py``), so the parent records
the kernel's table as workers start (``DescriptorTable``); each worker's first
step reopens each file at its offset and ``dup2``s it over the same number,
so every Python object above keeps its state (buffers, a ZipFile's directory).

- fork: the inherited descriptors are privatized in place.
- spawn: multiprocessing passes them under the same numbers (the table
  pickles as ``reduction.DupFd``): a dataset that keeps a descriptor by its
  number reads what it reads under fork, not ``EBADF``.
- forkserver and the warm server (DL209): they arrive under other numbers and
  go under their own where the worker has it free; the server's own files (a
  module-level ``open()`` of the main module it preloaded) are privatized in
  each of its children as it forks (``after_fork_in_server_child``).

Left alone: files only written (a log: every worker's lines arrive), pipes,
sockets, terminals, devices, torch's shared memory, stdio. A new description
holds no ``flock()`` of the parent's (HDF5 and lmdb lock their files), and
native handles hold no descriptor of theirs to give (h5py, lmdb, a
``cv2.VideoCapture``): those are reopened by path in each forked worker
(``reopen``).

What a forked worker cannot privatize is never left shared: it raises
``RemedyFailed``, and recovery steps down (DL216); a carried descriptor a
spawned worker cannot privatize is replaced by one that fails every read,
never another file. Workers report, as they exit, what they privatized and
used (the offset moved): the parent's record says what held, not what was
planned.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import json
import os
import sys
import types
from multiprocessing import context, reduction, util
from typing import Any

from ..inspection import holdings, objwalk
from ..inspection.descriptors import describe_open, find_descriptors, open_files, path_of
from ..inspection.diagnostics import in_fork_server
from ..inspection.failures import RemedyFailed, describe_exception
from ..inspection.parts import parts_of
from . import reopen
from .workerinit import user_function

HIGH_FD = 256  # where private and parked descriptors go: above what programs open
# A fork server takes at most 256 descriptors per start (multiprocessing's
# MAXFDS_TO_SEND), with its own among them.
MAX_CARRIED = 200


# -- one descriptor -------------------------------------------------------------

def reopen_description(fd, dev, ino, flags):
    """A new, close-on-exec open file description of the file on ``fd``, with
    the same access mode and status flags, checked to be the same file."""
    import fcntl  # noqa: PLC0415 - POSIX only: absent on Windows

    if sys.platform.startswith("linux"):
        path = "/proc/self/fd/%d" % fd  # reaches the file even if it was renamed or deleted
    else:
        path = path_of(fd)  # macOS: fcntl(F_GETPATH)
        if path is None:
            raise OSError("its path cannot be read back")
    new = os.open(path, (flags & os.O_ACCMODE) | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0))
    try:
        st = os.fstat(new)
        if (st.st_dev, st.st_ino) != (dev, ino):
            raise OSError("another file is at its path now")
        fcntl.fcntl(new, fcntl.F_SETFL, flags)
    except BaseException:
        os.close(new)
        raise
    return new


def _at_offset(found, source, put):
    """``put`` applied to a new description of ``found``'s file (reopened from
    ``source``) at its recorded offset, closed after."""
    new = reopen_description(source, found.dev, found.ino, found.flags)
    try:
        os.lseek(new, found.offset, os.SEEK_SET)
        return put(new)
    finally:
        os.close(new)


def privatize(found, source=None):
    """A description of its own of ``found`` under its number, reopened from
    ``source`` (the descriptor it arrived on) or its own; inheritable as it
    was, or, where it arrived, not (as Python opens files)."""
    _at_offset(found, found.fd if source is None else source, lambda new: os.dup2(
        new, found.fd, inheritable=source is None and os.get_inheritable(found.fd)))


def park(fd):
    """A second descriptor on ``fd``'s description, above what programs open."""
    import fcntl  # noqa: PLC0415 - POSIX only: absent on Windows

    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, HIGH_FD)


def private_copy(found):
    """An emulated worker's own description of ``found`` at its offset, parked."""
    return _at_offset(found, found.fd, park)


def reason(exc):
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else \
        describe_exception(exc)


def _fail_reads(fd):
    """Put a directory, on which every read fails, under ``fd``."""
    placeholder = os.open(os.sep, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.dup2(placeholder, fd, inheritable=False)
    finally:
        os.close(placeholder)


# -- the plan the rules read: what fork means for a loader's parts ---------------

# What forked workers would share, as a loader's parts show it (the log's names):
# ``isolate`` (``HeldDescriptor``s), ``shared`` (only written), ``handles`` and
# ``unhandled`` (``native_handles``'). What no object shows is privatized all the same.
ForkPlan = collections.namedtuple("ForkPlan", "isolate shared handles unhandled")


def users_parts(source):
    """The parts a forked worker of ``source`` (a loader or its arguments)
    uses, with the user's own worker_init_fn (ours adds no files)."""
    found = parts_of(source)
    found["worker_init_fn"] = user_function(found["worker_init_fn"])
    return found


def plan(parts):
    isolate, shared, unhandled = [], [], []
    for found in find_descriptors(parts):
        described = describe_open(found.fd)
        if described is None or not described.private:
            shared.append(found)
            continue
        try:  # tried for real, and undone
            os.close(reopen_description(found.fd, described.dev, described.ino, described.flags))
        except (OSError, ImportError) as exc:
            unhandled.append((found.describe(), "cannot be reopened (%s)" % reason(exc), None))
        else:
            isolate.append(found)
    handles, native = native_handles(parts)
    return ForkPlan(isolate, shared, handles, unhandled + native)


def native_handles(parts):
    """``([(HeldFile, reopen args, note)], [(path, why, fork_unsafe)])``: the
    native handles each forked worker reopens by path, and those it cannot
    (``fork_unsafe``: a handle a forked child must not use, else None)."""
    handles, unhandled = [], []
    h5 = holdings.h5py_types()
    for name, part in parts.items():
        if part is None:
            continue
        for found in holdings.find_files(part, name):
            obj = found.obj
            # A file object, or an h5py file: its descriptor is privatized with the
            # others (HDF5 reads at explicit offsets; its caches are the worker's own).
            if not holdings.is_native_handle(obj) or h5 and objwalk.is_a(obj, h5):
                continue
            if found.kind is None and holdings.fork_unsafe(obj) == holdings.VIDEO:
                why = "a capture that cannot be reopened (a camera or a stream)"
            elif found.kind != holdings.READONLY:
                continue  # a closed handle: left as it is
            elif not found.settable:
                why = "held where it cannot be replaced (an item of a tuple)"
            elif (args := reopen._reopen_args(obj)) is not None:
                handles.append((found, args, reopen.read_only_note(obj)))
                continue
            else:
                why = "cannot be reopened by path"
            unhandled.append((found.path, why, found.fork_unsafe))
    return handles, unhandled


# -- the table taken as workers start, and the worker step ------------------------

class DescriptorTable:
    """Taken as an iterator's workers start: ``files`` (``OpenFile``) and the
    native ``handles`` forked workers reopen."""

    def __init__(self, files=(), handles=(), report_dir=None, forked=True, carry=True):
        self.pid = os.getpid()
        self.files = list(files)
        self.handles = list(handles)
        self.report_dir = report_dir
        self.forked = forked  # forked workers privatize them (DL207)
        self.carry = carry    # spawned workers receive them (DL217)
        self.carried = None  # in a spawned worker: [(descriptor it arrived on, OpenFile)]
        self.by_number = {}  # {fd: where the loader's parts hold its number}: for the record

    @classmethod
    def take(cls, handles=(), report_dir=None, forked=True, carry=True):
        return cls(open_files(), handles, report_dir, forked, carry)

    def __bool__(self):
        return bool(self.files or self.handles)

    def __reduce__(self):
        popen = context.get_spawning_popen()
        files = self.files if popen is not None and self.carry else ()  # at a process start
        # Another thread may have closed one since, its number now a pipe
        # multiprocessing passes itself ("bad value(s) in fds_to_keep"); a close
        # between here and the child's start is not seen.
        files = _still_open(files)
        if _through_a_server(popen):
            files = files[:MAX_CARRIED]
        sent = [(reduction.DupFd(f.fd), f) for f in files]
        return _carried, (self.pid, sent, self.report_dir)

    def __repr__(self):
        return "own file descriptions in each worker"


def _still_open(files):
    """``files`` whose descriptor is still the file recorded, each number once."""
    kept, numbers = [], set()
    for f in files:
        if f.fd in numbers:
            continue
        try:
            st = os.fstat(f.fd)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == (f.dev, f.ino):
            kept.append(f)
            numbers.add(f.fd)
    return kept


def _through_a_server(popen):
    try:
        from multiprocessing import popen_forkserver  # noqa: PLC0415 - POSIX only; loads multiprocessing.forkserver, which activation._after_fork_in_child reads in sys.modules as "a fork server"
    except ImportError:  # Windows
        return False
    return isinstance(popen, popen_forkserver.Popen)


def _carried(pid, sent, report_dir):
    """In a spawned worker: the table, with the descriptors that arrived."""
    table = DescriptorTable((), (), report_dir)
    table.pid = pid
    table.carried = []
    for handle, found in sent:
        try:
            table.carried.append((handle.detach(), found))
        except Exception:
            table.carried.append((None, found))
    return table


FORKED, CARRIED, SERVER = "forked", "carried", "server"


def isolate_in_worker(table, worker_id):
    """Worker step, first of all; ``RemedyFailed`` for what a forked worker
    would share."""
    if table.pid == os.getpid():
        return  # an emulated worker: this process (emulated_workers swaps them itself)
    # ``(fd, name, offset at the start, FORKED/CARRIED/SERVER)``; ``(name, why)``.
    report = types.SimpleNamespace(private=[], missing=[])
    if table.carried is None:
        if table.forked:
            _in_forked_worker(table, worker_id, report)
    else:
        _in_spawned_worker(table, report)
    # The server's own files privatized at this process's fork, not those that arrived.
    arrived = {fd for fd, _found in table.carried or ()}
    report.private += [entry for entry in _server_files if entry[0] not in arrived]
    if table.report_dir is not None and (report.private or report.missing):
        util.Finalize(None, _write_report, args=(
            report_path(table.report_dir, os.getpid()), report), exitpriority=0)


def _in_forked_worker(table, worker_id, report):
    # Only what the worker inherited: a file another thread closed between the
    # table and the fork (its number maybe another file now) shares nothing here.
    for found in _still_open(table.files):
        try:
            privatize(found)
        except OSError as exc:
            raise RemedyFailed("%s could not be given its own offset in worker %d (%s)"
                               % (found.describe(), worker_id, reason(exc))) from None
        report.private.append((found.fd, found.name, found.offset, FORKED))
    for held, args in table.handles:
        try:
            reopen.reopen_in_forked_worker(held, args)
        except Exception as exc:
            raise RemedyFailed("%s could not be reopened in worker %d (%s)"
                               % (held.path, worker_id, describe_exception(exc))) from None


def _in_spawned_worker(table, report):
    for arrived, found in table.carried:
        fd = found.fd
        try:
            if arrived is None:
                raise OSError("it did not arrive")
            if arrived != fd and _taken(fd):
                raise OSError("this worker uses that number for another file")
            privatize(found, source=arrived)
            report.private.append((fd, found.name, found.offset, CARRIED))
        except OSError as exc:
            report.missing.append((found.describe(), reason(exc)))
            if arrived == fd:
                _fail_reads(fd)  # not the parent's shared description, nor another file
        finally:
            if arrived is not None and arrived != fd:
                with contextlib.suppress(OSError):
                    os.close(arrived)


def _taken(fd):
    """Whether ``fd`` is open here for something in use: not the server's own
    stdin on /dev/null, which a fork server's child holds and nothing uses
    (multiprocessing gives the worker a new one)."""
    try:
        st = os.fstat(fd)
    except OSError:
        return False
    try:
        stdin = sys.stdin.fileno() if sys.stdin is not None else None
    except (OSError, ValueError, AttributeError):
        stdin = None
    try:
        return fd == stdin or not os.path.samestat(st, os.stat(os.devnull))
    except OSError:
        return True


# -- the files a fork server holds: privatized in each child as it forks -----------

_server_files: list[Any] = []  # in a child of a fork server: what was privatized at its fork


# The rule of a fork server's children, where no check runs (AUTOSAFE_TORCH_DISABLE=DL207).
GOVERNED_BY = ("DL207", "dataloader")


def after_fork_in_server_child():
    """After fork, in a child of a fork server (multiprocessing's, or ours): the
    server's files privatized (NOTE [the data flow of a repaired loader] in
    torch_private.py, step 2)."""
    del _server_files[:]
    if not in_fork_server():
        return
    # A build server's files are its dataset's and its main module's, which a
    # spawned worker would have opened for itself: made its own, part of
    # DL201's rebuild, not reported as the server's.
    built = getattr(sys.modules.get(__package__ + ".buildserver"), "BUILT", None)
    for found in open_files():
        try:
            privatize(found)
        except OSError:
            _fail_reads(found.fd)  # never left shared with the server's other children
            continue
        if not built:
            _server_files.append((found.fd, found.name, found.offset, SERVER))


# -- what workers report, and what the parent reads ---------------------------------

def report_path(directory, pid):
    return os.path.join(directory, "isolated-pid%d.txt" % pid)


def _write_report(path, report):
    """At the worker's exit; used: the offset moved, not by appending."""
    import fcntl  # noqa: PLC0415 - POSIX only: absent on Windows

    private = []
    for fd, name, offset, how in report.private:
        try:
            used = os.lseek(fd, 0, os.SEEK_CUR) != offset \
                and not fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_APPEND
        except OSError:
            used = False  # closed by the worker: whether it read first is not known
        private.append((how, fd, used, name))
    with contextlib.suppress(OSError), open(path, "w") as f:
        json.dump([private, report.missing], f)


# What an iterator's workers reported: ``private``, ``{how: {name: fd}}`` of
# their own descriptions, ``used``, those read; ``missing``, ``{description:
# why}``, what did not reach a spawned worker; ``by_number``, ``held_numbers``'.
Usage = collections.namedtuple("Usage", "private used missing by_number")


class Outcome:
    """Workers' reports, read as they exit: ``said(usage)`` makes the records."""

    def __init__(self, table, said):
        self.table = table
        self._said = said

    def workers_exited(self, processes):
        pids = [p.pid for p in processes if getattr(p, "pid", None)]
        if not pids or self.table is None or self.table.report_dir is None:
            return
        usage = Usage({}, {}, {}, self.table.by_number)
        for pid in pids:
            path = report_path(self.table.report_dir, pid)
            try:
                with open(path) as f:
                    text = f.read()
                os.unlink(path)
                private, missing = json.loads(text)  # a worker killed while writing: none
            except (OSError, ValueError):
                continue
            for how, fd, used, name in private:
                usage.private.setdefault(how, {})[name] = fd
                if used:
                    usage.used.setdefault(how, {})[name] = fd
            usage.missing.update(missing)
        if usage.used or usage.missing or usage.private.get(CARRIED) and usage.by_number:
            self._said(usage)


def held_numbers(parts, fds):
    """``{fd: path}`` for each of ``fds`` an object of the user's own class
    among ``parts`` holds as an int attribute (``self.fd = os.open(...)``; a
    library's ints are no descriptors). For the words only."""
    wanted = {fd for fd in fds if fd > 2}
    found: dict[int, str] = {}
    for name, part in parts.items():
        if part is None or not wanted:
            continue
        for here, obj, _edge in objwalk.walk(part, name):
            try:
                children = list(objwalk.edges(obj))
            except Exception:
                continue
            if not children or not holdings.users_class(type(obj)):
                continue
            for edge in children:
                if type(edge.child) is int and edge.child in wanted \
                        and edge.how == objwalk.Edge.ATTR:
                    found.setdefault(edge.child, here + edge.label())
    return found


def worker_step(table):
    return functools.partial(isolate_in_worker, table)
