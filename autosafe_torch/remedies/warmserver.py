"""Inside a server of ours (DL209): it forks only while it has one OS
thread, serves only its own run, and a worker that dies while starting
leaves its traceback for recovery.

``warmstart.py`` names this module last in the server's preload list;
``forkserver.main`` then runs only its own loop (accept, fork, reap), no
library code but in the libraries' own threads. Only a thread starts a
thread, so a server with one thread now has one at every fork; one with more
is refused now, before any worker (``REFUSED``: plain spawn). A check before
each fork would put our code in the loop every worker inherits, and a
refusal there could only end the server mid-epoch.

On Linux a library may stop its threads at fork (OpenBLAS's pool, numpy's
and torch's BLAS, through pthread_atfork) and start them only when used,
which the server never does: one fork whose child exits at once
(``forks_safely``) shows what is left at the first worker's fork. On macOS
the Objective-C runtime asks whether a second thread has ever run
(``inspection/threads.py``), so nothing settles there.

A worker that fails in spawn's start prints its traceback to a stderr the
training process cannot read, so each child is told where to leave it
(``diagnostics.told``). Imported elsewhere, this module does nothing.
"""

import atexit
import contextlib
import functools
import hmac
import os
import sys
import time
import warnings

from ..inspection import threads
from ..mp_private import ProcessObject, forkserver_handed, forkserver_listener_path, wrap_spawn_main
from ..inspection.diagnostics import in_fork_server, listen_as_spawned

REFUSED = 86    # the server's exit status: more than one thread after its preload
UNCHECKED = 87  # its first child's: the server did not import this module
STRANGER = 88   # a child's: whoever asked for it did not have the run's secret
# the secret's file in the server's preload list: this (no module's name), then its path
SECRET = "autosafe_torch_server_secret="
_checked = []   # in the server: its threads were counted, and it forks


class Hello(ProcessObject):
    """The server's first child (``warmstart._run``): its exit status 0 says the
    server counted its threads and forks."""

    def run(self):
        return 0 if _checked else UNCHECKED


def forks_safely():
    """One thread, on Linux after a fork whose child exits at once (see the module)."""
    if threads.single_threaded():
        return True
    if not (sys.platform.startswith("linux") and threads.count()):
        return False
    with warnings.catch_warnings():
        # Python 3.12+ warns when a multi-threaded process forks: here that is
        # the question being asked, answered by the count that follows.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
        if pid == 0:
            os._exit(0)
    os.waitpid(pid, 0)
    return threads.single_threaded()


_EXITING = 0x4  # the kernel's PF_EXITING, in /proc/<pid>/stat's flags


def _gone(parent):
    """Whether ``parent`` has ended or is ending: the pipe that tells a server so
    closes a moment before its children get another parent, so its state says
    it first (Linux; elsewhere, the new parent)."""
    if os.getppid() != parent:
        return True
    try:
        with open("/proc/%d/stat" % parent) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return fields[0] in ("Z", "X") or bool(int(fields[6]) & _EXITING)
    except (OSError, ValueError, IndexError):
        return False


def _only_ours(secret, main, fd, *args):
    """A child of the server, before spawn's ``_main`` unpickles anything: the
    run's ``secret`` first, else it ends (a local process that found the
    server's socket is not the training process)."""
    got = b""
    while len(got) < len(secret):
        chunk = os.read(fd, len(secret) - len(got))
        if not chunk:
            break
        got += chunk
    if not hmac.compare_digest(got, secret):
        os._exit(STRANGER)
    return main(fd, *args)


def _remove_listener(path, parent):
    """At the server's exit: the socket it listened on, and, where the training
    process ended without its clean-up (SIGKILL, ``os._exit``), its
    multiprocessing folder (``pymp-*``) where nothing else is left."""
    try:
        os.unlink(path)
        folder = os.path.dirname(path)
        if _gone(parent) and os.path.basename(folder).startswith("pymp-"):
            # 2 s at most for the children (exit_with_parent ends them) and their sockets
            deadline = time.monotonic() + 2.0
            with contextlib.suppress(ChildProcessError):  # none left
                while time.monotonic() < deadline:
                    if os.waitpid(-1, os.WNOHANG)[0] == 0:
                        time.sleep(0.01)
            os.rmdir(folder)  # only where empty: anything else in it is not ours
    except OSError:
        pass


if in_fork_server():
    if not forks_safely():
        os._exit(REFUSED)
    _checked.append(True)
    _listening = forkserver_listener_path()
    if _listening:
        atexit.register(_remove_listener, _listening, os.getppid())
    _given = None
    with contextlib.suppress(OSError):
        _given = forkserver_handed(SECRET)
    if not _given:
        os._exit(UNCHECKED)  # never a server that would serve whoever connects
    wrap_spawn_main(functools.partial(_only_ours, _given))
    listen_as_spawned()
