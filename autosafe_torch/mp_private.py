"""The one place that touches multiprocessing's private parts (and threading's
and concurrent.futures'), which a Python release may rename, as torch's go
through ``torch_private.py``: ``tests/test_mp_private.py`` pins what each
piece does on every supported Python (3.9 to 3.13), ``tests/test_layers.py``
fails where such a private name is used elsewhere. Nothing here imports the
rest of the package, nor torch.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import os
import socket
import sys
import threading
import types
from collections.abc import Iterator
from multiprocessing import process
from multiprocessing.reduction import ForkingPickler
from typing import Any, Callable


def extra_reducers() -> dict[type, Callable[[Any], Any]]:
    """ForkingPickler's ``{class: reducer}`` (``register``'s), changed in place."""
    return ForkingPickler._extra_reducers  # type: ignore[attr-defined]  # private: see above


def context_name(context: Any) -> str | None:
    """The start method a ``multiprocessing`` context object stands for."""
    return getattr(context, "_name", None)


def default_start_method() -> str:
    """The start method multiprocessing would pick now, without fixing it
    (``get_start_method()`` would)."""
    default = multiprocessing.context._default_context  # the DefaultContext
    return default._default_context._name  # type: ignore[attr-defined]  # private


def forkserver_pid(server: Any) -> int | None:
    """None before it runs."""
    return server._forkserver_pid


def stop_forkserver(server: Any, close: Callable[[int], None] = os.close) -> int:
    """Close (with ``close``) the pipe whose EOF ends ``server``; its pid (a
    server that never ran fails at the close)."""
    close(server._forkserver_alive_fd)
    return server._forkserver_pid


def popen_reading(start_method: str, name: str, modules: dict[str, Any],
                  namespace: dict[str, Any] | None = None) -> type:
    """A subclass ``name`` of the stdlib's ``Popen`` for ``start_method`` whose
    method that pickles for the child (``_launch``; Windows': ``__init__``) is
    the stdlib's own code, not a copy, reading the module names in ``modules``
    (``reduction``, ``forkserver``, ``spawn``) from the objects there;
    ``namespace`` besides."""
    base: type
    if sys.platform == "win32":
        from multiprocessing.popen_spawn_win32 import Popen as base  # noqa: PLC0415 - Windows only
    elif start_method == "forkserver":
        from multiprocessing.popen_forkserver import Popen as base  # noqa: PLC0415 - POSIX only; loads multiprocessing.forkserver, which activation._after_fork_in_child reads in sys.modules as "a fork server"
    else:
        from multiprocessing.popen_spawn_posix import Popen as base  # noqa: PLC0415 - POSIX only
    method = "__init__" if sys.platform == "win32" else "_launch"
    dumps = getattr(base, method)
    scope = dict(dumps.__globals__, **modules)
    reading = types.FunctionType(dumps.__code__, scope, dumps.__name__,
                                 dumps.__defaults__, dumps.__closure__)
    return type(name, (base,), dict(namespace or {}, **{method: reading}))


@contextlib.contextmanager
def inheriting() -> Iterator[None]:
    """While this process unpickles what a parent sent it, as ``spawn._main``
    does (objects that may only be inherited check it)."""
    process.current_process()._inheriting = True  # type: ignore[attr-defined]  # private
    try:
        yield
    finally:
        del process.current_process()._inheriting  # type: ignore[attr-defined]  # private


def start_through(process: Any, popen: type) -> bool:
    """Have ``process`` (not started) start through ``popen`` where its class
    starts it the stdlib's way (else False: the warm start's has its own). An
    attribute, gone before the Popen pickles it: its class stays (the child
    unpickles it by reference)."""
    if type(process)._Popen.__module__ != "multiprocessing.context":
        return False
    process._Popen = functools.partial(_started_by, popen)
    return True


def _started_by(popen: type, process: Any) -> Any:
    del process._Popen
    return popen(process)


def forkserver_process(popen: Callable[[Any], Any], name: str, module: str) -> type:
    """A subclass ``name`` of ``ForkServerProcess`` whose processes start through
    ``popen(process)`` (its ``_Popen``), pickled by reference as ``module.name``."""
    return type(name, (multiprocessing.context.ForkServerProcess,),
                {"_Popen": staticmethod(popen), "__module__": module, "__qualname__": name})


class ProcessObject:
    """What a fork server's child is sent to run: its exit status is ``run()``'s."""

    def run(self) -> int:
        raise NotImplementedError

    def _bootstrap(self, parent_sentinel: Any = None) -> int:
        return self.run()


def process_target(process: Any) -> Any:
    return getattr(process, "_target", None)


def forkserver_main() -> types.FrameType | None:
    """The frame of ``forkserver.main`` below this call, or None."""
    forkserver = sys.modules.get("multiprocessing.forkserver")
    frame: types.FrameType | None = sys._getframe(1)
    while forkserver is not None and frame is not None:
        if frame.f_code is forkserver.main.__code__:
            return frame
        frame = frame.f_back
    return None


def _forkserver_main_locals() -> dict[str, Any]:
    frame = forkserver_main()
    return dict(frame.f_locals) if frame is not None else {}


def forkserver_listener_path() -> str | None:
    """In a fork server, while it preloads: the path of the socket it listens on
    (``forkserver.main``'s ``listener_fd``), else None."""
    fd = _forkserver_main_locals().get("listener_fd")
    if not isinstance(fd, int):
        return None
    try:
        with socket.socket(socket.AF_UNIX, fileno=os.dup(fd)) as listener:
            path = listener.getsockname()
    except OSError:
        return None
    return path if isinstance(path, str) and path else None


def forkserver_preload() -> list[str]:
    """In a fork server, while it preloads: the names it was given to preload
    (``forkserver.main``'s ``preload``), else []."""
    return list(_forkserver_main_locals().get("preload") or ())


def forkserver_handed(prefix: str) -> bytes | None:
    """In a fork server, while it preloads: what the file its preload list names
    as ``prefix`` + its path holds, removed as it is read, else None."""
    path = next((e[len(prefix):] for e in forkserver_preload() if e.startswith(prefix)), None)
    if not path:
        return None
    with open(path, "rb") as f:
        os.unlink(path)
        return f.read()


def wrap_spawn(name: str, wrapper: Callable[..., Any]) -> None:
    """``spawn.<name>`` made ``wrapper(original, *args)``, once per ``wrapper`` (a
    fork server's child reads what it was sent in ``spawn._main(fd, parent_sentinel)``)."""
    from multiprocessing import spawn  # noqa: PLC0415 - 0.2 ms at `import cv2` before torch, where the rules load this module (-X importtime: runpy, multiprocessing.spawn)

    original = getattr(spawn, name)
    if getattr(original, "func", None) is not wrapper:
        setattr(spawn, name, functools.partial(wrapper, original))


wrap_spawn_main: Callable[[Callable[..., Any]], None] = functools.partial(wrap_spawn, "_main")


# The releases whose fork server listened in Linux's abstract socket namespace, open
# to every local user (CVE-2022-42919), before the fix (a private folder's path). Told
# by version: asking multiprocessing for an address would make its folder.
_ABSTRACT_FORKSERVER = (((3, 9), (3, 9, 16)), ((3, 10), (3, 10, 9)), ((3, 11), (3, 11, 1)))


def forkserver_listens_abstract(version: tuple[int, ...] | None = None) -> bool:
    version = tuple(version or sys.version_info[:3])
    return any(first <= version < fixed for first, fixed in _ABSTRACT_FORKSERVER)


# -- the objects of multiprocessing, threading and concurrent.futures a dataset holds

def semlock_of(lock: Any) -> Any:
    """The ``_multiprocessing.SemLock`` under a multiprocessing Lock, RLock or
    Semaphore (its ``name`` is None where a fork context made it)."""
    return lock._semlock


def pool_processes(pool: Any) -> int:
    """How many workers a ``multiprocessing.pool`` Pool or ThreadPool was made with."""
    return pool._processes


def pool_running(pool: Any) -> bool:
    """Whether a ``multiprocessing.pool`` pool has workers and was not closed."""
    return bool(getattr(pool, "_pool", ())) and getattr(pool, "_state", None) == "RUN"


def executor_arguments(executor: Any) -> tuple[int, str]:
    """``(max_workers, thread_name_prefix)`` a ThreadPoolExecutor was made with."""
    return executor._max_workers, executor._thread_name_prefix


def executor_threads(executor: Any) -> Any:
    """The threads a ThreadPoolExecutor started (none before its first task)."""
    return getattr(executor, "_threads", ())


def python_rlock() -> type | None:
    """threading's RLock written in Python (where a C one is missing), if any."""
    return getattr(threading, "_PyRLock", None)


def locks_inside(attrs: dict[str, Any]) -> list[Any]:
    """The lock or condition a threading Condition, Semaphore, Event or Barrier
    keeps, from its ``__dict__`` ``attrs`` ([] for another object's)."""
    return [attrs[name] for name in ("_cond", "_lock") if attrs.get(name) is not None]


def rlock_owned(rlock: Any) -> bool:
    return rlock._is_owned()


def new_semaphore(semaphore: Any) -> Any:
    """A threading semaphore made as ``semaphore`` was (a BoundedSemaphore with
    its initial value, another with its value now)."""
    if isinstance(semaphore, threading.BoundedSemaphore):
        initial = semaphore._initial_value  # type: ignore[attr-defined]  # private: see above
        return threading.BoundedSemaphore(initial)
    return type(semaphore)(semaphore._value)
