"""What each piece of autosafe_torch/mp_private.py does, checked against the
running Python's multiprocessing (POSIX). Run as a script by any CPython from
3.9 on, torch or not: mp_private is loaded from its file alone. Prints one
"ok <name>" line per check; the first failure raises."""

import importlib.util
import multiprocessing
import os
import pathlib
import stat
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from multiprocessing import (forkserver, popen_forkserver, popen_spawn_posix, process, reduction,
                             spawn)
from multiprocessing.pool import ThreadPool
from multiprocessing.reduction import ForkingPickler

HERE = pathlib.Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location(
    "mp_private_alone", HERE.parent / "autosafe_torch" / "mp_private.py")
mp_private = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mp_private)


class Registered:
    pass


def _reduce_registered(obj):
    return Registered, ()


class Made:
    """The Popen the check makes, which starts a ThroughProcess (not pickled)."""

    popen = None


def _made_popen(process_obj):
    return Made.popen(process_obj)


ThroughProcess = mp_private.forkserver_process(_made_popen, "ThroughProcess", __name__)


def child_writes(path):
    with open(path, "w") as f:
        f.write("ran %d" % os.getpid())


def check_extra_reducers():
    table = mp_private.extra_reducers()
    ForkingPickler.register(Registered, _reduce_registered)
    try:
        assert table.get(Registered) is _reduce_registered  # the same table, in place
        assert isinstance(ForkingPickler.loads(ForkingPickler.dumps(Registered())), Registered)
    finally:
        table.pop(Registered, None)
    assert Registered not in ForkingPickler(open(os.devnull, "wb")).dispatch_table


def check_context_name():
    for method in multiprocessing.get_all_start_methods():
        assert mp_private.context_name(multiprocessing.get_context(method)) == method
    assert mp_private.context_name(object()) is None


def check_default_start_method():
    # Asked without fixing it: the program may still choose.
    assert multiprocessing.get_start_method(allow_none=True) is None
    method = mp_private.default_start_method()
    assert multiprocessing.get_start_method(allow_none=True) is None
    assert method == multiprocessing.get_start_method()  # what it then picks


def check_forkserver_pid_and_stop():
    server = forkserver.ForkServer()
    assert mp_private.forkserver_pid(server) is None  # not running yet
    server.ensure_running()
    pid = mp_private.forkserver_pid(server)
    assert isinstance(pid, int) and pid > 0
    os.kill(pid, 0)  # alive
    assert mp_private.stop_forkserver(server) == pid
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        done, _status = os.waitpid(pid, os.WNOHANG)
        if done:
            return
        time.sleep(0.02)
    raise AssertionError("the fork server did not exit when its pipe closed")


class _Spawn:
    """``spawn`` as the launch reads it, counting what it asks."""

    asked = 0

    def __getattr__(self, name):
        return getattr(spawn, name)

    def get_preparation_data(self, name):
        _Spawn.asked += 1
        return spawn.get_preparation_data(name)


class _Reduction:
    """``reduction`` as the launch reads it, counting what it dumps."""

    dumped = 0

    def __getattr__(self, name):
        return getattr(reduction, name)

    def dump(self, obj, file, protocol=None):
        _Reduction.dumped += 1
        reduction.dump(obj, file, protocol)


def check_popen_reading(tmp):
    server = forkserver.ForkServer()
    server.ensure_running()

    class Through:
        used = 0

        def __getattr__(self, name):
            return getattr(forkserver, name)

        def connect_to_new_process(self, fds):
            Through.used += 1
            return server.connect_to_new_process(fds)

    popen = mp_private.popen_reading("forkserver", "ThroughPopen", {
        "forkserver": Through(), "spawn": _Spawn(), "reduction": _Reduction()}, {"asked": 0})
    assert popen._launch.__code__ is popen_forkserver.Popen._launch.__code__  # its code, not a copy
    assert issubclass(popen, popen_forkserver.Popen) and popen.asked == 0
    assert issubclass(ThroughProcess, multiprocessing.context.ForkServerProcess)
    check_started(popen, os.path.join(tmp, "child.txt"))
    assert Through.used == 1 and _Spawn.asked == 1 and _Reduction.dumped == 2
    mp_private.stop_forkserver(server)
    _Spawn.asked = _Reduction.dumped = 0
    popen = mp_private.popen_reading("spawn", "SpawnPopen",
                                     {"spawn": _Spawn(), "reduction": _Reduction()})
    assert popen._launch.__code__ is popen_spawn_posix.Popen._launch.__code__
    assert issubclass(popen, popen_spawn_posix.Popen)
    assert not mp_private.start_through(ThroughProcess(target=child_writes), popen)  # its own
    path = os.path.join(tmp, "spawned.txt")
    child = multiprocessing.get_context("spawn").Process(target=child_writes, args=(path,))
    assert mp_private.start_through(child, popen)
    child.start()
    child.join(30)
    assert child.exitcode == 0 and "_Popen" not in vars(child), child.exitcode
    assert type(child) is multiprocessing.context.SpawnProcess
    with open(path) as f:
        assert f.read().startswith("ran ")
    assert _Spawn.asked == 1 and _Reduction.dumped == 2  # the preparation data, the process


def check_started(popen, path):
    Made.popen = popen
    child = ThroughProcess(target=child_writes, args=(path,))  # pickled by reference
    assert mp_private.process_target(child) is child_writes
    child.start()
    child.join(30)
    assert child.exitcode == 0, child.exitcode
    with open(path) as f:
        assert f.read().startswith("ran ")


PRELOAD_PROBE = """
import importlib.util, os
spec = importlib.util.spec_from_file_location("mp_private_alone", %r)
mp_private = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mp_private)
# written whole, then renamed: the check polls for the name, and must never read it half written
with open(os.path.join(%r, "preload.txt.part"), "w") as f:
    f.write(repr((mp_private.forkserver_preload(), mp_private.forkserver_listener_path())))
os.replace(f.name, f.name[:-len(".part")])
"""


def check_forkserver_preload(tmp):
    """A module a fork server preloads reads the list it was given and the path
    it listens on (the server's sys.path holds its working directory: the probe
    module is there)."""
    with open(os.path.join(tmp, "preload_probe.py"), "w") as f:
        f.write(PRELOAD_PROBE % (str(HERE.parent / "autosafe_torch" / "mp_private.py"), tmp))
    assert mp_private.forkserver_preload() == [] and \
        mp_private.forkserver_listener_path() is None  # not in a fork server
    server = forkserver.ForkServer()
    wanted = ["preload_probe", "no_such_module=/a/path"]
    server.set_forkserver_preload(wanted)
    server.ensure_running()
    path = os.path.join(tmp, "preload.txt")
    deadline = time.monotonic() + 20
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.02)
    with open(path) as f:
        preload, listening = eval(f.read())  # noqa: S307 - our own file, a repr
    assert preload == wanted, preload
    assert stat.S_ISSOCK(os.stat(listening).st_mode), listening
    mp_private.stop_forkserver(server)


def check_inheriting():
    me = process.current_process()
    assert not getattr(me, "_inheriting", False)
    with mp_private.inheriting():
        assert me._inheriting is True
    assert not hasattr(me, "_inheriting")


def check_process_object():
    class Exits(mp_private.ProcessObject):
        def run(self):
            return 7

    assert Exits()._bootstrap(parent_sentinel=3) == 7  # as spawn._main calls it
    assert mp_private.process_target(object()) is None


def check_held_objects():
    """The privates of what a dataset may hold: multiprocessing's, threading's,
    concurrent.futures'."""
    for method, unlinked in (("fork", True), ("spawn", False)):
        lock = multiprocessing.get_context(method).Lock()
        assert (mp_private.semlock_of(lock).name is None) == unlinked, method
    pool = ThreadPool(2)
    assert mp_private.pool_processes(pool) == 2 and mp_private.pool_running(pool)
    pool.close()
    assert not mp_private.pool_running(pool)
    pool.join()
    executor = ThreadPoolExecutor(3, thread_name_prefix="p")
    assert mp_private.executor_arguments(executor) == (3, "p")
    assert not mp_private.executor_threads(executor)  # none before a task
    executor.submit(int).result()
    assert mp_private.executor_threads(executor)
    executor.shutdown()
    rlock = mp_private.python_rlock()()
    assert not mp_private.rlock_owned(rlock)
    with rlock:
        assert mp_private.rlock_owned(rlock)
    for obj in (threading.Condition(), threading.Semaphore(), threading.Event(),
                threading.Barrier(1)):
        (inner,) = mp_private.locks_inside(vars(obj))
        assert hasattr(inner, "acquire"), obj
    assert mp_private.locks_inside({}) == []
    semaphore, bounded = threading.Semaphore(3), threading.BoundedSemaphore(2)
    semaphore.acquire()
    bounded.acquire()
    for old, kind, free in ((semaphore, threading.Semaphore, 2),
                            (bounded, threading.BoundedSemaphore, 2)):
        new = mp_private.new_semaphore(old)
        assert type(new) is kind
        assert [new.acquire(blocking=False) for _ in range(free + 1)] == [True] * free + [False]


def main(tmp):
    check_extra_reducers()
    print("ok extra_reducers")
    check_context_name()
    print("ok context_name")
    check_default_start_method()
    print("ok default_start_method")
    check_forkserver_pid_and_stop()
    print("ok forkserver_pid stop_forkserver")
    check_popen_reading(tmp)
    print("ok popen_reading start_through forkserver_process")
    check_forkserver_preload(tmp)
    print("ok forkserver_preload")
    check_inheriting()
    print("ok inheriting")
    check_process_object()
    print("ok ProcessObject process_target")
    check_held_objects()
    print("ok semlock_of pool_processes pool_running executor_arguments executor_threads "
          "python_rlock rlock_owned locks_inside new_semaphore")


if __name__ == "__main__":
    main(sys.argv[1])
