"""Warm worker start: spawn's semantics without spawn's start-up cost (DL209).

A spawn worker of a non-persistent loader imports torch, numpy and cv2
again every epoch (over a second of CPU) before its first sample. The
workers of ``warm_context`` fork instead from a server of ours that imported
those installed libraries once, never the user's code, holds no lock of the
parent's and forks only with one OS thread (``warmserver.py``); a loader
whose datasets are built again in each worker (DL201) gets a build server
(``Build``, ``buildserver.py``) that builds them once. Each worker then
takes spawn's own steps (preparation data, the main module as
``__mp_main__``, the pickled process object, torch's worker loop and seeds)
under spawn's name for it.

A worker takes from the server, not the parent, its signal dispositions and
nice value (as under forkserver), its stdout/stderr, CPU affinity and
open-file limit: where one of the last three changed since the server
started, or a server cannot start or fork, workers start by plain spawn,
logged once. Torch's watchdog watches ``os.getppid()``, the server:
``exit_with_parent`` ends a worker when the training process dies.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import multiprocessing
import os
import pickle
import sys
import sysconfig
import threading
import time
import weakref
from multiprocessing import connection, reduction, resource_sharer, spawn
from multiprocessing import context as _mp_context
from typing import Any

from ..inspection.diagnostics import PARENT_KEY, private_file
from ..inspection.failures import describe_exception
from ..inspection.opened import TURNS
from ..mp_private import forkserver_pid, forkserver_process, popen_reading, stop_forkserver
from ..report import log, shorten_line
from . import process_state
from .pickling import TO_WORKERS, Overriding, sent_popen

__all__ = ["warm_context", "preload", "libraries_for", "named", "exit_with_parent"]

_lock = threading.Lock()    # the server's state; held while a new server starts
_names_lock = threading.Lock()  # the preload list and the builds: never held for long
_preload: list[str] = []          # module names the server imports when it starts
_state: dict[str, Any] = {"server": None, "started_with": None, "cold": None, "ahead": False}
# imported last by the server: its thread check and its children's guards
GUARD = "autosafe_torch.remedies.warmserver"


# -- what the server preloads -------------------------------------------------------

def _installed(name):
    """Whether module ``name`` (imported here) is under a library or site
    directory, where a worker finds it as the server does."""
    path = getattr(sys.modules.get(name), "__file__", None)
    paths = sysconfig.get_paths()
    dirs = [paths[k] for k in ("purelib", "platlib", "stdlib", "platstdlib") if k in paths]
    dirs += [p for p in sys.path
             if isinstance(p, str) and os.path.basename(p) in ("site-packages", "dist-packages")]
    return bool(path and os.path.realpath(path).startswith(
        tuple(os.path.realpath(d) + os.sep for d in dirs)))


def libraries_for(parts):
    """The installed modules a spawned worker of a loader with ``parts`` imports
    before its first sample: torch (the worker loop), numpy (torch seeds it),
    cv2 (CV401/CV402 set it up in every worker), the parts' (unpickling)."""
    names = ["torch", "numpy", "cv2"]
    for part in parts:
        if part is None:
            continue
        for obj in (part, type(part), getattr(part, "func", None)):
            module = getattr(obj, "__module__", None)
            if isinstance(module, str) and module not in names:
                names.append(module)
    return [n for n in names if n != "__main__" and _installed(n)]


def preload(names):
    """Names for the server to import when it starts (later ones each worker
    imports, as under spawn)."""
    with _names_lock:
        _preload.extend(n for n in names if n not in _preload)


_OURS = __package__.partition(".")[0]


def named(libraries, most=3):
    """``libraries`` as ``threadlib, torch and 1 more``: top-level packages, not
    the standard library's, others' first (the news for the reader)."""
    tops = []
    for name in libraries:
        top = name.partition(".")[0]
        if top not in tops and top != _OURS and not _in_stdlib(top):
            tops.append(top)
    tops.sort(key=lambda top: top in ("torch", "numpy", "cv2"))
    more = len(tops) - most
    return (", ".join(tops[:most]) or "nothing") + (" and %d more" % more if more > 0 else "")


def _in_stdlib(name):
    names = getattr(sys, "stdlib_module_names", None)  # Python 3.10+
    if names is not None:
        return name in names
    path = getattr(sys.modules.get(name), "__file__", None)
    if path is None:
        return name in sys.builtin_module_names
    path = os.path.realpath(path)
    return (path.startswith(os.path.realpath(sysconfig.get_paths()["stdlib"]) + os.sep)
            and "site-packages" not in path)


# -- a server of ours: the shared one, and a build server -------------------------------

def _forkserver():
    from multiprocessing import forkserver  # noqa: PLC0415 - activation._after_fork_in_child reads multiprocessing.forkserver in sys.modules as "a fork server"

    return forkserver


def _inherited():
    """What a forked worker gets from the server and no start request can set."""
    def stdio(fd):
        try:
            st = os.fstat(fd)
            return st.st_dev, st.st_ino
        except OSError:
            return None

    try:
        affinity = frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = None
    try:
        import resource  # noqa: PLC0415 - POSIX only: absent on Windows

        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        nofile = None
    return {"stdout/stderr": (stdio(1), stdio(2)), "CPU affinity": affinity,
            "open-file limit": nofile}


def _server():
    """The running shared server, started now if need be; None: use plain spawn."""
    with TURNS.ours() as churned, _lock:
        if _state["cold"]:
            return None
        if _state["server"] is None:
            _state["server"] = _forkserver().ForkServer()
        server, now = _state["server"], _inherited()
        started, refused = _run(server, churned)
        if started:
            _state["started_with"] = now
            if refused is None:
                return server
            _state["server"] = None
            _went_cold(refused)
            return None
    changed = [k for k, v in _state["started_with"].items() if now[k] != v]
    if changed:
        _starts.reason = ("the %s changed since the warm server started (a fork of it "
                          "cannot take the new one)" % " and ".join(changed))
        return None
    return server


def _run(server, churned, extra=(), also=""):
    """Have ``server`` run, (re)started importing the libraries, then ``extra``:
    whether it started now, and why it does not fork (None: it does; else it
    is stopped). Its secret, which each child checks before it unpickles
    anything, goes in a file (``_handed``)."""
    from .warmserver import REFUSED, SECRET, UNCHECKED, Hello  # noqa: PLC0415 - importing warmserver runs the server's set-up (os._exit without the run's secret) wherever diagnostics.in_fork_server() holds, as in a fork server's child, which imports this module (exit_with_parent)

    with _names_lock:
        libraries = list(_preload)
    before = forkserver_pid(server)
    if getattr(server, "autosafe_secret", None) is None:
        server.autosafe_secret = os.urandom(32)  # made once, kept on it
    with _handed("secret", server.autosafe_secret, SECRET) as secret:
        server.set_forkserver_preload(libraries + list(extra) + [secret, GUARD])
        server.ensure_running()  # restarts a server that died
        if forkserver_pid(server) == before:
            return False, None
        # It forks once its first child, a ``warmserver.Hello``, exits with 0.
        status = None
        try:
            status_r, data_w = _connect(server, [])
            try:
                with open(data_w, "wb", closefd=True) as f:
                    # Our path only (to unpickle Hello): the main module is not imported.
                    reduction.dump({"sys_path": sys.path}, f)
                    reduction.dump(Hello(), f)
                churned()
                _forkserver().read_signed(status_r)  # the child's pid, then its exit status
                status = _forkserver().read_signed(status_r)
            finally:
                TURNS.close(status_r)
        except (OSError, EOFError):
            pass  # the server ended: its own exit status says why
    if status == 0:
        return True, None
    ended, imported = _stop(server), named(libraries, most=2) + also
    if ended == REFUSED:
        return True, ("the warm server had more than one thread after importing %s "
                      "(unsafe to fork)" % imported)
    if status == UNCHECKED:
        return True, ("the warm server could not import autosafe_torch to count its threads "
                      "after importing %s" % imported)
    return True, "the warm server did not start its first process after importing %s (%s)" % (
        imported, "exit status %s" % (ended if status is None else status))


@contextlib.contextmanager
def _handed(kind, data, entry):
    """While a server starts: ``data`` in a new private file, named in its preload
    list as ``entry`` + the path (our environment would reach our other
    children); the server removes it as it reads it, we after."""
    path = private_file(kind)
    with open(path, "wb") as f:
        f.write(data)
    try:
        yield entry + path
    finally:
        with contextlib.suppress(OSError):
            os.remove(path)


def _connect(server, fds):
    """A new process from ``server``, sent the run's secret first."""
    status_r, data_w = server.connect_to_new_process(fds)
    try:
        view = memoryview(server.autosafe_secret)
        while view:
            view = view[os.write(data_w, view):]
    except BaseException:
        os.close(status_r)
        os.close(data_w)
        raise
    return status_r, data_w


def _stop(server, wait_s=5.0):
    """``server``'s exit status once stopped (None: not seen in ``wait_s``)."""
    pid, deadline = stop_forkserver(server, TURNS.close), time.monotonic() + wait_s
    with contextlib.suppress(ChildProcessError):
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status)
            time.sleep(0.01)
    return None


def _stop_quietly(server):
    with contextlib.suppress(Exception):
        _stop(server, wait_s=1.0)


def start_ahead(libraries, context=None):
    """Start the server (or ``context``'s build server) now, in a thread, for a
    loader the ladder will repair for spawn: its imports overlap the program's
    own setup instead of delaying the first epoch. Once at most."""
    preload(libraries)
    build = getattr(context, "_build", None)
    if build is None:
        with _names_lock:
            if _state["ahead"] or _state["server"] is not None or _state["cold"]:
                return
            _state["ahead"] = True
    threading.Thread(target=_start_ahead, args=(build,), name="autosafe_torch warm start",
                     daemon=True).start()


def _start_ahead(build):
    try:
        if build is None:
            _server()
        else:
            _retire_ahead()
            build.server()
    except Exception as exc:  # fails open: the loader's first iterator tries again
        _note("the warm server could not start ahead (%s)" % _failure(exc))


def _retire_ahead():
    """The shared server, started ahead for a loader a build server serves,
    goes while no worker came from it: it would only hold memory (figure 18b)."""
    with _lock:
        server = _state["server"]
        if server is None or _starts.warm:
            return
        _state["server"] = None
    _stop_quietly(server)


def _preparation_data(name):
    """spawn's, plus the parent's environment and umask now, which a server
    started before the program's setup (an optimizer sets
    TORCHINDUCTOR_CACHE_DIR) would not give its workers."""
    data = spawn.get_preparation_data(name)
    umask = os.umask(0o022)  # read, then set back
    os.umask(umask)
    data[PARENT_KEY] = (dict(os.environ), umask)
    return data


def _popen(process_obj):
    """Start ``process_obj`` from its build server, else the warm server, else by spawn."""
    build = _builds.get(process_obj)
    try:
        server, built = build.server() if build is not None else (None, {})
        if server is None:
            server = _server()
        if server is not None:
            from .buildserver import from_server  # noqa: PLC0415 - 0.7 ms in each warm worker, which imports this module for exit_with_parent (-X importtime after torch: buildserver, rebuild, descriptors, opened, generators)

            # the stdlib's Popen over our server, preparation and pickler; built_here
            # for rebuild.reduce_rebuilt
            popen = popen_reading("forkserver", "WarmPopen", {
                "forkserver": Overriding(_forkserver(), connect_to_new_process=functools.partial(
                    _connect, server)),
                "spawn": Overriding(spawn, get_preparation_data=_preparation_data),
                "reduction": TO_WORKERS,
            }, {"built_here": built, "from_server": staticmethod(from_server)})
            started = popen(process_obj)
            _starts.warm += 1
            _starts.built += bool(built)
            return started
    except Exception as exc:
        _went_cold("the warm server failed (%s)" % _failure(exc))
    _starts.plain += 1
    return sent_popen("spawn")(process_obj)


# -- build servers: a rebuilt loader's datasets built once ----------------------------

_builds: weakref.WeakKeyDictionary[Any, Build] = weakref.WeakKeyDictionary()  # process -> Build
_kept_for: dict[int, Build] = {}  # id(a dataset) -> its Build, while the dataset lives


class Build:
    """A build server for some datasets, from the first worker's start until the
    datasets go. ``server()``: ``(server, {id(dataset): key})``, or ``(None,
    {})`` (each worker builds them)."""

    _known: weakref.WeakValueDictionary[tuple[int, ...], Build] = weakref.WeakValueDictionary()

    @classmethod
    def of(cls, datasets):
        """The one Build for these datasets (planned ahead and at iter() alike)."""
        key = tuple(sorted(map(id, datasets)))  # for _known
        with _names_lock:
            build = cls._known.get(key)
            if build is None or any(ref() is None for ref in build.refs):
                build = cls._known[key] = cls(datasets)
            for dataset in datasets:
                if id(dataset) not in _kept_for:  # alive as long as the dataset is
                    weakref.finalize(dataset, _kept_for.pop, id(dataset), None)
                _kept_for[id(dataset)] = build
            return build

    def __init__(self, datasets):
        self.refs = [weakref.ref(d) for d in datasets]
        self.keys = {id(d): "%d-%d" % (os.getpid(), id(d)) for d in datasets}
        self.forkserver = None
        self.refused = False
        self.carry: Any = None  # the loader's process_state.Carry (DL220), set by warm_context

    def server(self):
        with TURNS.ours() as churned, _lock:
            if self.forkserver is None and not self.refused:
                datasets = [ref() for ref in self.refs]
                if any(d is None for d in datasets):
                    return None, {}
                try:
                    self.forkserver = self._start(datasets, churned)
                except Exception as exc:
                    _note("a build server could not start (%s): each worker builds the dataset"
                          % _failure(exc))
                self.refused = self.forkserver is None
                for dataset in [] if self.refused else datasets:
                    weakref.finalize(dataset, _stop_quietly, self.forkserver)
            return (None, {}) if self.refused else (self.forkserver, self.keys)

    def _start(self, datasets, churned):
        from . import buildserver, rebuild  # noqa: PLC0415 - 0.7 ms in each warm worker, which imports this module for exit_with_parent (-X importtime after torch: buildserver, rebuild, descriptors, opened, generators)

        prepared = spawn.get_preparation_data("autosafe_torch build server")
        if "authkey" in prepared:  # pickles only for a child being started: as bytes here
            prepared["authkey"] = bytes(prepared["authkey"])
        if not ({"init_main_from_path", "init_main_from_name"} & set(prepared)):
            return None  # an interactive main: the server could not import its classes
        recipes = {self.keys[id(d)]: rebuild.recipe(d) for d in datasets}
        changed = {label for d in datasets
                   for label in getattr(rebuild.construction_of(d), "changed", ())}
        # What the workers' code reads now (DL220), set before the build, pickled
        # apart; not what the constructions ``changed`` (a counter): the build
        # starts from the import's.
        state = None
        if self.carry is not None:
            with contextlib.suppress(Exception):  # a carry that does not pickle
                reads = [r for r in self.carry.reads if r.label not in changed]
                state = pickle.dumps(process_state.Carried(reads, None).in_server(),
                                     pickle.HIGHEST_PROTOCOL)
        # loaded in this order: the main module, what main() set, then its classes
        data = b"".join(pickle.dumps(part, pickle.HIGHEST_PROTOCOL)
                        for part in (prepared, state, recipes))
        server = _forkserver().ForkServer()
        with _handed("build", data, buildserver.RECIPES) as entry:
            refused = _run(server, churned, [buildserver.__name__, entry], " and the dataset")[1]
        if refused is not None:
            _note("no build server (%s): each worker builds the dataset" % refused)
            return None
        return server


def exit_with_parent(worker_id):
    """Worker step: exit once the training process is gone (torch's watchdog
    sees only the server)."""
    parent = multiprocessing.parent_process()
    if parent is None or parent.pid == os.getppid():
        return
    threading.Thread(target=_exit_when_ready, args=(parent.sentinel,), daemon=True,
                     name="autosafe_torch parent watch").start()


def _exit_when_ready(sentinel):
    connection.wait([sentinel])
    # the socket its batches' descriptors went through: gone, as at a normal exit
    with contextlib.suppress(Exception):
        resource_sharer.stop(timeout=1.0)
    os._exit(1)


def _failure(exc):
    return shorten_line(describe_exception(exc), 80)


class _Starts:
    """How this process's workers came (DL209's record): ``warm`` (``built``: from
    a build server), or ``plain`` spawn and why (``reason``, the latest)."""

    warm = plain = built = 0
    reason: str | None = None

    def mark(self):
        return self.warm, self.plain, self.built

    def since(self, mark):
        return tuple(now - then for now, then in zip(self.mark(), mark))


_starts = _Starts()


def starts():
    return _starts


def _went_cold(why):
    _state["cold"] = True
    _starts.reason = "workers start by plain spawn from now on: " + why
    _note(_starts.reason)


@functools.cache
def _note(message):
    """Said once, at debug level: a user reads DL209's record (``recovery``)."""
    log(logging.DEBUG, "DL209 warm-worker-start: %s", message)


def warm_context(context, builds=(), carry=None):
    """The warm context replacing ``context`` (None or spawn's); ``builds``:
    datasets a build server builds once, after ``carry`` (DL220). (NOTE [the
    data flow of a repaired loader] in torch_private.py, step 2.)"""
    name = "Process" if context is None else "SpawnProcess"
    if not builds:
        return _contexts[name]
    build = Build.of(builds)
    build.carry = carry if carry is not None else build.carry
    return WarmContext(name, build)


_contexts: dict[str, Any] = {}  # the process name -> the context without builds

# Windows has no forkserver (the rule never asks for a warm context there).
if hasattr(_mp_context, "ForkServerContext"):
    WarmProcess = forkserver_process(_popen, "WarmProcess", __name__)

    class WarmContext(_mp_context.ForkServerContext):
        """A forkserver context whose server is ours (with a ``Build``: its)."""

        def __init__(self, process_name, build=None):
            self._process_name = process_name
            self._build = build

        # typeshed declares the stdlib's Process a class; this is called as one is
        def Process(self, *args, **kwargs):  # type: ignore[override]
            process = WarmProcess(*args, **kwargs)
            default = WarmProcess.__name__ + "-"
            if process.name.startswith(default):
                process.name = self._process_name + "-" + process.name[len(default):]
            if self._build is not None:
                _builds[process] = self._build
            return process

        def set_forkserver_preload(self, module_names):
            preload(module_names)

        def __repr__(self):
            return "warm forkserver (preloads %s%s)" % (
                ", ".join(_preload) or "nothing",
                "; builds the dataset once" if self._build is not None else "")

    _contexts.update((name, WarmContext(name)) for name in ("Process", "SpawnProcess"))
