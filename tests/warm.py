"""A warm interpreter: ``python script args`` without paying ``import torch`` again.

Measured on d5b23be, the 551 scripts a ``make test`` starts took 647 of its
1,224 s of CPU, nearly all of it their ``import torch`` (1.1-1.3 s each). Each
test process keeps one server (this file, run as a script) that imported torch
once, from an environment like ``support.clean_env()``'s, and forks it for each
run that may start this way (``eligible``). The child is made into the process that
``python script args`` would have started, before the script runs:

- its descriptors 0, 1 and 2 are /dev/null and the two output files, and no
  other is open (as ``subprocess.run`` starts a child);
- its working directory, environment, ``sys.argv``, ``sys.orig_argv`` and
  ``sys.path`` (the script's directory, then PYTHONPATH, then the rest) are
  those of the run;
- torch is not imported: every ``torch`` module is taken out of ``sys.modules``
  and comes back, the same objects, when the program imports torch, through
  an import finder, so that a post-import hook (the shim's, the platform
  simulator's) sees the import as it would see a real one; what torch's import
  added to the process that depends on when it ran (its warnings filters, which
  go in front of those set before it; its ``atexit`` callbacks, which run
  before those registered earlier) is taken out and put back then too; the
  same for ``torch._dynamo``, which the server imports next (building an
  optimizer imports it: another second), whose modules come back when the
  program first imports one of them, with the variables its import set in
  ``os.environ`` (``TORCHINDUCTOR_CACHE_DIR``, where not set already), the
  loggers it made and what it set in modules imported before it (it wraps
  ``torch.manual_seed``: a program that seeds and builds no optimizer calls
  torch's own, and imports nothing); two classes it changes stay changed
  (``Placement``'s comparison, ``CacheInfo``'s fields: nothing our scripts use);
- ``site``'s work that depends on the environment is done again: the
  ``autosafe_torch.pth`` line (``AUTOSAFE_TORCH=1`` activates there), then
  ``sitecustomize`` (the platform simulator's, or the template's), found on the
  run's own ``sys.path``;
- the random generators a fresh interpreter seeds from the system (``random``,
  numpy's global one, multiprocessing's authkey) are seeded again;
- the script runs as ``__main__`` from its file (``-m`` as runpy runs it), an
  uncaught exception is printed from the script's first frame, and the child
  ends as an interpreter does (non-daemon threads joined, ``atexit``, buffers
  flushed).

What stays shared with the server is what a fresh interpreter cannot tell:
modules those imports brought that are not torch's (numpy, sympy,
dataclasses: the same code), the hash seed (``PYTHONHASHSEED``), which
every run of one test process shares, and the collector's permanent generation,
where the objects of the server's imports lie (``_freeze``). A run whose
environment differs from the server's in a variable that is read before the
script runs (torch's, OpenMP's, Python's own) is not eligible and starts a
fresh interpreter.
"""

import json
import logging
import os
import signal
import sys
import types

# The modules ``import torch`` brings that the server holds back until the
# program imports torch (the rest are the stdlib's and numpy's: the same code).
HELD_BACK = ("torch", "torchgen", "functorch")
# What the server imports, in order, each held back in a child until its program
# imports it: torch (1.1-1.3 s), then torch._dynamo (another second: building an
# optimizer imports it, and most scripts do).
IMPORTED = ("torch", "torch._dynamo")

# Variables a run may set that nothing reads before its script runs (ours, the
# platform simulator's after its start, a scenario's, pytest's name of the running
# test); any other difference from the server's environment means a fresh
# interpreter (``eligible``).
# TORCHINDUCTOR_CACHE_DIR: torch sets it when the script builds an optimizer (so
# its spawned workers start with it) and reads it only when it compiles.
LATE_VARIABLES = ("AUTOSAFE_", "SCENARIO_", "PYTHONPATH", "PYTEST_", "TORCHINDUCTOR_CACHE_DIR")
# Read at start: the platform simulator narrows the CPUs before torch's OpenMP
# counts them. A run that sets them is forked from a server of its own, started
# with them (``support.warm_server``).
EARLY_VARIABLES = ("AUTOSAFE_TEST_CPUS",)


def read_early(env, server_env):
    """The variables, read before a script runs, in which ``env`` differs from
    ``server_env`` (those that keep a run from being forked from the server)."""
    return sorted(name for name in set(env) | set(server_env)
                  if env.get(name) != server_env.get(name)
                  and (name in EARLY_VARIABLES or not name.startswith(LATE_VARIABLES)))


def eligible(env, server_env):
    """Whether a run with ``env`` may be forked from a server started with
    ``server_env``: they differ only in variables read after the start."""
    return not read_early(env, server_env)


# -- the server (this file run as a script) ---------------------------------------------

def _say(fd, message):
    os.write(fd, json.dumps(message).encode() + b"\n")


_MISSING = object()


def _set(module, key, value):
    if value is _MISSING:
        vars(module).pop(key, None)
    else:
        vars(module)[key] = value


class _Group:
    """What one import in the server added that a fresh interpreter would get
    only when its program makes that import: its modules (torch's own; the
    stdlib's, numpy's and sympy's stay, the same code), its warnings filters
    (they go in front of those set before), its ``atexit`` calls (they run
    before those registered earlier), the variables it set in ``os.environ``,
    the loggers it made, and what it set in modules imported before it (such
    as ``torch.manual_seed``, which ``torch._dynamo`` wraps: a program that
    seeds and never builds an optimizer calls torch's own)."""

    def __init__(self, root, record):
        import warnings

        modules_before, filters_before = set(sys.modules), list(warnings.filters)
        env_before, record.exit_calls = dict(os.environ), []
        loggers_before = set(logging.Logger.manager.loggerDict)
        attributes_before = {name: dict(vars(module)) for name, module in sys.modules.items()
                             if isinstance(module, types.ModuleType)}
        __import__(root)
        self.root, self.exit_calls = root, record.exit_calls
        self.filters = [f for f in warnings.filters if f not in filters_before]
        self.modules = {name: module for name, module in sys.modules.items()
                        if name not in modules_before and name.partition(".")[0] in HELD_BACK}
        self.specs = {name: (module.__spec__, getattr(module, "__loader__", None))
                      for name, module in self.modules.items()}
        self.env = {k: v for k, v in os.environ.items() if k not in env_before}
        self.loggers = {name: logger for name, logger
                        in logging.Logger.manager.loggerDict.items()
                        if name not in loggers_before}
        # (module, name, value before or _MISSING, value after); a module a
        # name came to hold that stays imported keeps it (an import of it that
        # finds it in sys.modules would not set it again).
        self.attributes = []
        for name, before in attributes_before.items():
            module = sys.modules.get(name)
            after = vars(module) if module is not None else {}
            for key in set(before) | set(after):
                old, new = before.get(key, _MISSING), after.get(key, _MISSING)
                if old is new or (key.startswith("__") and key.endswith("__")):
                    continue
                if isinstance(new, types.ModuleType) and new not in self.modules.values():
                    continue
                self.attributes.append((module, key, old, new))

    def hold_back(self):
        """In a child: as if the import had not been made."""
        import atexit
        import warnings

        for name in self.modules:
            del sys.modules[name]
        for module, key, old, _new in self.attributes:
            _set(module, key, old)
        for name in self.loggers:
            del logging.Logger.manager.loggerDict[name]
        for func, _args, _kwargs in self.exit_calls:
            atexit.unregister(func)
        for entry in self.filters:
            warnings.filters.remove(entry)

    def give_back(self):
        """The program makes the import: what it would have left."""
        import atexit
        import warnings

        for name, module in self.modules.items():
            sys.modules.setdefault(name, module)
        for module, key, _old, new in self.attributes:
            _set(module, key, new)
        for name, logger in self.loggers.items():
            logging.Logger.manager.loggerDict.setdefault(name, logger)
        warnings.filters[:0] = self.filters
        warnings._filters_mutated()
        for func, args, kwargs in self.exit_calls:
            atexit.register(func, *args, **kwargs)
        for name, value in self.env.items():  # as torch sets them: where not set yet
            os.environ.setdefault(name, value)


class _Imports:
    """The server's imports (``IMPORTED``), each a ``_Group`` held back in a
    child and given back when its program first imports one of its modules."""

    def __init__(self):
        import atexit

        self.exit_calls = []
        self._register = atexit.register
        atexit.register = self._record_exit_call
        try:
            self.groups = [_Group(root, self) for root in IMPORTED]
        finally:
            atexit.register = self._register
        self.server_env = dict(os.environ)

    def _record_exit_call(self, func, *args, **kwargs):
        self.exit_calls.append((func, args, kwargs))
        return self._register(func, *args, **kwargs)

    def hold_back(self):
        """In a child: as if torch had not been imported yet."""
        import warnings

        for group in self.groups:
            group.hold_back()
        warnings._filters_mutated()
        sys.meta_path.insert(0, _HeldBack(self.groups))


class _HeldBack:
    """Finds a held module for an import, as the module the server imported;
    its loader's ``exec_module`` gives back the whole group it came with (a
    later group only after those before it: ``torch._dynamo`` after ``torch``)."""

    def __init__(self, groups):
        self.groups, self.held = groups, list(groups)

    def find_spec(self, name, path=None, target=None):
        if not any(name in group.modules for group in self.held):
            return None  # not held, or given back already (and so in sys.modules)
        import importlib.util

        return importlib.util.spec_from_loader(name, self)

    def create_module(self, spec):
        group = next(g for g in self.held if spec.name in g.modules)
        while self.held and self.held[0] is not group:  # those before it first
            self._give_back(self.held[0])
        self._give_back(group)
        return group.modules[spec.name]

    def _give_back(self, group):
        self.held.remove(group)
        group.give_back()
        if not self.held and self in sys.meta_path:
            sys.meta_path.remove(self)

    def exec_module(self, module):
        # The import set the module's __spec__ (and a hook its __loader__): its own again.
        group = next(g for g in self.groups if module.__name__ in g.specs)
        spec, loader = group.specs[module.__name__]
        module.__spec__ = spec
        if loader is not None:
            module.__loader__ = loader


def _child(request, held):
    """In the child the server forked: the process ``python`` would have
    started for ``request``; or, in a worker its zygote forked later, the one
    that worker's spawn asked for. Returns the request that process runs."""
    if request.get("session"):
        os.setsid()
    spawned = _zygote(held)
    if spawned is not None:
        _given_descriptors(spawned)
        _inherit(spawned)
        _become(spawned, held)
        return spawned
    null = os.open(os.devnull, os.O_RDONLY)
    out = os.open(request["stdout"], os.O_WRONLY | os.O_APPEND)
    err = os.open(request["stderr"], os.O_WRONLY | os.O_APPEND)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(err, 2)
    os.closerange(3, _MAX_FD)
    _become(request, held)
    _spawn_warm_from(os.getpid(), held.server_env)
    return request


_MAX_FD = os.sysconf("SC_OPEN_MAX") if hasattr(os, "sysconf") else 4096


def _become(request, held):
    """The rest of a fresh start: what the process reads of its run."""
    import random

    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    if "multiprocessing.process" in sys.modules:  # its import notes where it started
        sys.modules["multiprocessing.process"].ORIGINAL_DIR = os.getcwd()
    argv = request["argv"]
    if hasattr(sys, "orig_argv"):  # Python 3.10+
        sys.orig_argv = list(request.get("orig_argv", argv))
    if argv[1] == "-m":
        sys.argv = ["-m"] + argv[3:]
        first = os.getcwd()
    elif argv[1] == "-c":
        sys.argv = ["-c"] + argv[3:]
        first = ""
    else:
        sys.argv = argv[1:]
        first = os.path.dirname(os.path.realpath(argv[1]))
    path = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [first] + path + sys.path[1:]
    sys.path_importer_cache.clear()
    held.hold_back()
    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    import multiprocessing

    multiprocessing.current_process().authkey = os.urandom(32)
    _site_again()


def _site_again():
    """What ``site`` does at start that reads the environment: the project's
    ``.pth`` line, then ``sitecustomize`` from the run's ``sys.path``."""
    import site

    for directory in site.getsitepackages():
        if os.path.exists(os.path.join(directory, "autosafe_torch.pth")):
            site.addpackage(directory, "autosafe_torch.pth", set(sys.path))
            break
    sys.modules.pop("sitecustomize", None)
    site.execsitecustomize()


def _run_as_main(argv):
    """Run the script (or ``-m`` module) as the interpreter would."""
    import builtins
    import importlib.machinery
    import types

    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main
    if "__mp_main__" in sys.modules:  # multiprocessing names __main__ so when imported
        sys.modules["__mp_main__"] = main
    if argv[1] == "-m":
        import runpy

        run, target = runpy._run_module_as_main, (argv[2],)
    elif argv[1] == "-c":
        main.__dict__.update(__package__=None, __spec__=None, __annotations__={},
                             __builtins__=builtins,
                             __loader__=importlib.machinery.BuiltinImporter)
        run, target = exec, (compile(argv[2], "<string>", "exec", dont_inherit=True),
                             main.__dict__)
    else:
        script = os.path.abspath(argv[1])
        main.__dict__.update(__package__=None, __spec__=None, __annotations__={},
                             __builtins__=builtins, __file__=script, __cached__=None,
                             __loader__=importlib.machinery.SourceFileLoader("__main__", script))
        with open(script, "rb") as f:
            code = compile(f.read(), script, "exec", dont_inherit=True)
        run, target = exec, (code, main.__dict__)
    try:
        run(*target)
    except SystemExit:
        raise
    except BaseException as exc:
        # As the interpreter's PyErr_Print: the traceback from the script's first
        # frame kept in sys.last_* (so the frames, and what they hold, such as a
        # DataLoader iterator and its workers, live until the interpreter ends),
        # then the hook; no reference to it is left here, where it would make a
        # cycle that the collector ends at another time (a worker shutdown in the
        # middle of an atexit callback's import waited 10 s).
        tb = exc.__traceback__
        tb = tb.tb_next if tb is not None else None
        exc.with_traceback(tb)
        sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, tb
        if sys.version_info >= (3, 12):
            sys.last_exc = exc
        sys.excepthook(type(exc), exc, tb)
        del tb
    else:
        return
    sys.exit(1)


def _freeze():
    """Put what the server's imports made (torch's 160k objects) in the collector's
    permanent generation, which no collection in a child traverses: each full
    collection of a run, and its exit's (0.2-0.4 s with torch), would otherwise
    read all of them and copy every page they lie on from the server (a forked run
    of a spawn scenario took 3.2 s of CPU, 1.3 s frozen). What a run can tell:
    ``gc.get_objects()`` and ``gc.get_referrers()`` do not list these objects (the
    shim's ``path_of`` looks from a program's object back to the program's own
    dataset, which the server never made), and cycles among them are not collected
    at exit (torch's, from its import: no ``__del__`` a program sees)."""
    import gc

    gc.collect()
    gc.freeze()


def serve():
    """Read requests from stdin and fork a child for each; answer its pid at
    once, and its exit status when it ends (children run side by side).
    Returns only in a child, with its request."""
    import select

    if any(name in os.environ for name in EARLY_VARIABLES):
        # A server for runs that set them: the platform simulator reads them
        # here, before torch's import, as it does at a fresh start.
        import runpy

        runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                    "platform_sim", "sitecustomize.py"))
    held = _Imports()
    _freeze()
    buffer, children = b"", {}
    _say(1, {"ready": True})
    while True:
        ready, _, _ = select.select([0, *children], [], [])
        for fd in ready:
            if fd in children:
                pid = children.pop(fd)
                os.close(fd)
                _, status = os.waitpid(pid, 0)
                _say(1, {"exit": pid, "status": status})
                continue
            chunk = os.read(0, 65536)
            if not chunk:
                sys.exit(0)
            buffer += chunk
            while b"\n" in buffer:
                line, _, buffer = buffer.partition(b"\n")
                request = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    try:
                        return _child(request, held)
                    except BaseException as exc:
                        os.write(2, ("warm: the child could not start: %r\n"
                                     % (exc,)).encode())
                        os._exit(125)
                children[os.pidfd_open(pid)] = pid
                _say(1, {"pid": pid})


# -- spawned workers, forked warm too ---------------------------------------------------
#
# A run's spawned processes (spawn's DataLoader workers, a forkserver, the
# shim's servers) would each start a fresh interpreter and import torch again.
# Each warm run therefore forks, before it becomes the run, a zygote: a copy of
# the server, torch imported and held back, that waits on a socket named after
# the run's pid. ``multiprocessing.util.spawnv_passfds``, which every
# multiprocessing start of a new interpreter calls, asks the zygote when the
# command is ``python -c ...`` and the environment is one the server may start
# (``eligible``); otherwise, or when anything fails before a process exists,
# it starts the interpreter as before.
#
# The zygote forks an intermediate that forks the worker and exits, while the
# run is a child subreaper, so the worker becomes the run's own child: its pid
# is the one ``spawnv_passfds`` returns, the run waits for it, signals reach it,
# and ``os.getppid()`` in it is the run (torch's watchdog, our dump directory).
# It gets what exec would have given it: the descriptors 0-2 and those passed
# (the same numbers, nothing else open), the environment as the C library holds
# it, the working directory, the signal mask, the signals ignored, the umask,
# the CPU affinity and the open-file limit; then the rest of ``_become``.

PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER, PR_GET_CHILD_SUBREAPER = 1, 36, 37


def _socket_name(pid):
    return "\0autosafe-warm-zygote-%d" % pid


def _prctl(option, value):
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if option == PR_GET_CHILD_SUBREAPER:
        flag = ctypes.c_int(0)
        libc.prctl(option, ctypes.byref(flag), 0, 0, 0)
        return flag.value
    if libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(%d)" % option)
    return None


def _zygote(held):
    """Fork this run's zygote. Returns None in the run; in a worker the
    zygote forked, that worker's request (with its descriptors)."""
    import socket

    run = os.getpid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        listener.bind(_socket_name(run))
    except OSError:
        listener.close()
        return None  # a name still held: this run's spawns start fresh
    listener.listen(16)
    if os.fork() != 0:
        listener.close()
        return None
    try:
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # ends with the run
        if os.getppid() != run:
            os._exit(0)
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)  # the server's pipes: never held open by the zygote
        keep = listener.fileno()
        os.closerange(3, keep)
        os.closerange(keep + 1, _MAX_FD)
        while True:
            conn, _ = listener.accept()
            message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 256)
            request = json.loads(message)
            middle = os.fork()
            if middle == 0:
                worker = os.fork()
                if worker == 0:
                    conn.close()
                    listener.close()
                    request["received"] = fds
                    return request
                conn.send(json.dumps({"pid": worker}).encode())
                os._exit(0)
            os.waitpid(middle, 0)  # the worker is the run's child from here
            conn.close()
            for fd in fds:
                os.close(fd)
    except BaseException as exc:  # the zygote (or its middle process) never returns
        try:
            os.write(2, ("warm: the zygote ended: %r\n" % (exc,)).encode())
        finally:
            os._exit(0)


def _spawn_warm_from(run, server_env):
    """In a warm run: ``multiprocessing.util.spawnv_passfds`` asks this run's
    zygote where it may."""
    import threading
    from multiprocessing import util

    original = util.spawnv_passfds
    lock = threading.Lock()

    def spawnv_passfds(path, args, passfds):
        if os.getpid() != run or not _may_spawn_warm(path, args):
            return original(path, args, passfds)
        env = _c_environ()
        if not eligible(env, server_env):
            return original(path, args, passfds)
        with lock:
            orig_argv = [os.fsdecode(a) for a in args]
            argv = orig_argv[:1] + orig_argv[orig_argv.index("-c"):]  # flags: the zygote's
            pid = _ask_zygote(run, dict(argv=argv, orig_argv=orig_argv, env=env,
                                        cwd=os.getcwd(), **_inherited()),
                              tuple(sorted({0, 1, 2, *map(int, passfds)})))
        return original(path, args, passfds) if pid is None else pid

    spawnv_passfds.__wrapped__ = original
    util.spawnv_passfds = spawnv_passfds


def _may_spawn_warm(path, args):
    """``python -c ...``, this interpreter with the flags it runs with (those
    the zygote has: the server's)."""
    from multiprocessing import util

    flags = util._args_from_interpreter_flags()
    args = [os.fsdecode(a) for a in args]
    return (os.fsdecode(path) == sys.executable and args[0] == sys.executable
            and args[1:len(flags) + 1] == flags and args[len(flags) + 1:len(flags) + 2] == ["-c"]
            and len(args) >= len(flags) + 3)


def _c_environ():
    """The environment exec would pass: the C library's, which a library may
    have changed without ``os.environ`` knowing."""
    import ctypes

    environ = ctypes.POINTER(ctypes.c_char_p).in_dll(ctypes.CDLL(None), "environ")
    env, i = {}, 0
    while environ[i] is not None:
        name, _, value = os.fsdecode(environ[i]).partition("=")
        env.setdefault(name, value)
        i += 1
    return env


def _inherited():
    """What a process started by exec keeps of this one."""
    import resource

    mask = os.umask(0)
    os.umask(mask)
    ignored = [int(s) for s in signal.valid_signals()
               if s not in (signal.SIGKILL, signal.SIGSTOP)
               and signal.getsignal(s) is signal.SIG_IGN]
    return dict(umask=mask, ignored=ignored,
                blocked=sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
                cpus=sorted(os.sched_getaffinity(0)),
                nofile=list(resource.getrlimit(resource.RLIMIT_NOFILE)))


def _ask_zygote(run, request, fds):
    """The pid of the worker this run's zygote started for ``request``, now a
    child of this process; None where none was started."""
    import socket

    fds = tuple(fd for fd in fds if _is_open(fd))
    request["fds"] = list(fds)
    subreaper = _prctl(PR_GET_CHILD_SUBREAPER, 0)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        conn.connect(_socket_name(run))
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
        socket.send_fds(conn, [json.dumps(request).encode()], list(fds))
        answer = conn.recv(4096)
        while conn.recv(4096):  # closed once the middle process has ended
            pass
    except OSError:
        return None
    finally:
        conn.close()
        if not subreaper:
            _prctl(PR_SET_CHILD_SUBREAPER, 0)
    return json.loads(answer)["pid"] if answer else None


def _is_open(fd):
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _given_descriptors(request):
    """The worker's descriptors: those the run passed, at their numbers."""
    import fcntl

    wanted, received = request["fds"], request.pop("received")
    floor = max([*wanted, *received]) + 1
    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, floor) for fd in received]
    for fd in received:
        os.close(fd)
    for number, fd in zip(wanted, moved):  # nothing else is open: the zygote saw to that
        os.dup2(fd, number, inheritable=True)
        os.close(fd)


def _inherit(request):
    """What exec would have kept of the run (``_inherited``)."""
    import resource

    os.umask(request["umask"])
    for signum in request["ignored"]:
        signal.signal(signum, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_SETMASK, request["blocked"])
    os.sched_setaffinity(0, request["cpus"])
    resource.setrlimit(resource.RLIMIT_NOFILE, tuple(request["nofile"]))


# -- the client (a test process) ----------------------------------------------------------

class Server:
    """This test process's warm interpreter, started at its first run; ``popen``
    and ``run`` as ``subprocess``'s, for the runs it may start (``eligible``)."""

    # Called with each finished run's (stdout, stderr), as conftest looks at what
    # every subprocess printed.
    outputs_seen = []

    def __init__(self, python, env):
        import atexit
        import shutil
        import tempfile
        import threading

        self.python, self.env = python, env
        self._lock = threading.RLock()
        self._proc = None
        self._dir = tempfile.mkdtemp(prefix="autosafe-warm-")
        # Removed as this test process ends (its server ends with it: EOF on stdin).
        atexit.register(shutil.rmtree, self._dir, ignore_errors=True)
        self._buffer = b""
        self._exits = {}

    def _start(self):
        import subprocess

        with open(os.path.join(self._dir, "server.log"), "ab") as log:
            self._proc = subprocess.Popen([self.python, os.path.abspath(__file__)],
                                          env=self.env, stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, stderr=log, cwd=self._dir)
        if self._message(None) != {"ready": True}:
            raise RuntimeError("the warm interpreter did not start: see %s" % log.name)

    def _message(self, timeout):
        """The server's next message, or None after ``timeout`` seconds."""
        import select

        fd = self._proc.stdout.fileno()
        while b"\n" not in self._buffer:
            ready, _, _ = select.select([fd], [], [], timeout)
            if not ready:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                raise RuntimeError("the warm interpreter exited")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(line)

    def popen(self, argv, cwd, env, start_new_session=False):
        """A started run, used as ``subprocess.Popen(argv, cwd=cwd, env=env,
        stdout=PIPE, stderr=PIPE, text=True)`` is."""
        import tempfile

        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._start()
            outputs = []
            for name in ("stdout", "stderr"):
                fd, path = tempfile.mkstemp(dir=self._dir, prefix=name)
                os.close(fd)
                outputs.append(path)
            request = dict(argv=[str(a) for a in argv], cwd=str(cwd), env=env,
                           stdout=outputs[0], stderr=outputs[1], session=start_new_session)
            self._proc.stdin.write(json.dumps(request).encode() + b"\n")
            self._proc.stdin.flush()
            while True:
                message = self._message(60)
                if message is None:
                    raise RuntimeError("the warm interpreter did not answer")
                if "pid" in message:
                    return WarmProcess(self, argv, message["pid"], outputs)
                self._exits[message["exit"]] = message["status"]

    def status(self, pid, timeout):
        """``pid``'s wait status once it ended; None if it still runs after
        ``timeout`` seconds (0: do not wait; None: wait for it)."""
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while pid not in self._exits:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                message = self._message(left)
                if message is None:
                    return None
                self._exits[message["exit"]] = message["status"]
            return self._exits.pop(pid)

    def run(self, argv, cwd, env, timeout):
        """``subprocess.run(argv, cwd=cwd, env=env, capture_output=True,
        text=True, timeout=timeout)``."""
        import subprocess

        proc = self.popen(argv, cwd, env)
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise
        return subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)

    def close(self):
        if self._proc is not None and self._proc.poll() is None:
            self._proc.stdin.close()
            self._proc.wait(30)


class WarmProcess:
    """A run forked from the warm interpreter, used as a ``subprocess.Popen``."""

    def __init__(self, server, args, pid, outputs):
        self._server, self.args, self.pid, self._outputs = server, args, pid, outputs
        self.returncode = None

    def poll(self):
        if self.returncode is None:
            status = self._server.status(self.pid, 0)
            if status is not None:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout=None):
        import subprocess

        if self.returncode is None:
            status = self._server.status(self.pid, timeout)
            if status is None:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def communicate(self, timeout=None):
        import subprocess

        try:
            self.wait(timeout)
        except subprocess.TimeoutExpired:
            raise subprocess.TimeoutExpired(self.args, timeout, *self._read()) from None
        outputs = self._read()
        for path in self._outputs:
            if os.path.exists(path):
                os.unlink(path)
        for seen in Server.outputs_seen:
            seen(*outputs)
        return outputs

    def _read(self):
        return tuple(_text(path) if os.path.exists(path) else "" for path in self._outputs)

    def kill(self):
        self.send_signal(signal.SIGKILL)

    def terminate(self):
        self.send_signal(signal.SIGTERM)

    def send_signal(self, signum):
        if self.returncode is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass


def _text(path):
    """A file's bytes as ``subprocess.run(text=True)`` decodes a pipe's."""
    import locale

    with open(path, "rb") as f:
        data = f.read()
    text = data.decode(locale.getpreferredencoding(False))
    return text.replace("\r\n", "\n").replace("\r", "\n")


if __name__ == "__main__":
    _server_module = sys.modules["__main__"]  # kept: the child replaces __main__
    _run_as_main(serve()["argv"])
