"""What went wrong with a loader's worker processes, read from what torch,
the kernel and the workers' own faulthandler dumps say.

Plain torch reports one worker death as "killed by signal", "exited
unexpectedly", ``ConnectionResetError`` or a bare ``EOFError``, at random
(the batches a dead worker queued no longer unpickle), and loses the
worker's traceback. Here the kind comes from the exception and the exit
codes, the cause from the worker's dump; nothing is changed, no user code run.

Kinds: ``died`` (an exit code or a signal), ``shm`` (shared memory: a bus
error, "unable to allocate shared memory"), ``fds`` (open files), ``hung``
(no batch for the watchdog's limit, every worker alive), ``memory``
(``MemoryError`` or ENOMEM in a worker), ``remedy`` (a repair a worker could
not apply: ``RemedyFailed``), ``cuda`` (a forked worker touched CUDA, which a
child forked after the parent initialised it cannot).
"""

import errno
import functools
import os
import signal
import sysconfig

DIED, HUNG, SHM, FDS, MEMORY, REMEDY, CUDA = ("died", "hung", "shm", "fds", "memory", "remedy",
                                             "cuda")


class RemedyFailed(RuntimeError):
    """Raised in a worker by a repair that meets what it cannot handle there (a
    file that can no longer be reopened), never to run on with the hazard in
    place: recovery steps down (DL216)."""

    def __init__(self, message):
        super().__init__("autosafe_torch: %s" % message if not message.startswith((
            "autosafe_torch", "Caught ")) else message)

# torch's runtime words (its DataLoader's are torch_private.py's), which
# tests/test_recovery.py's real faults make torch say, kept here so that classifying
# needs no torch import. CUDA's: a forked child touched it (a RuntimeError,
# torch.AcceleratorError from 2.8).
WORDS = {FDS: ("Too many open files", "received 0 items of ancdata"),
         SHM: ("unable to allocate shared memory", "unable to write to file </torch_",
               "unable to mmap"),
         CUDA: ("Cannot re-initialize CUDA in forked subprocess",
                "CUDA error: initialization error")}
_NO_WORKER = {SHM: "out of shared memory", FDS: "out of file descriptors"}


def _chain(exc):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def kept(exc):
    """``exc``, to be kept, without the frames it was raised through: they hold
    every local up the stack (the DataLoader iterator being made) until the
    next garbage collection, and a worker's end would wait for it."""
    for e in _chain(exc):
        e.__traceback__ = None
    return exc


def exception_kind(exc):
    for e in _chain(exc):
        if isinstance(e, RemedyFailed):
            return REMEDY
        if isinstance(e, MemoryError) or isinstance(e, OSError) and e.errno == errno.ENOMEM:
            return MEMORY
        if isinstance(e, OSError) and e.errno in (errno.EMFILE, errno.ENFILE):
            return FDS
        text = exception_text(e)
        for kind, said in WORDS.items():
            if any(words in text for words in said):
                return kind
    return None


def lost_peer(exc):
    """Raised while unpickling a batch whose worker is gone (its resource sharer
    or shared memory went with it): a death, once a dead worker is found."""
    return any(isinstance(e, (EOFError, ConnectionError, FileNotFoundError)) for e in _chain(exc))


def exit_status(exitcode):
    if exitcode is None:
        return "alive"
    if exitcode < 0:
        try:
            sig = signal.Signals(-exitcode)
            return "killed by signal %s (%s)" % (sig.name, signal.strsignal(sig))
        except ValueError:
            return "killed by signal %d" % -exitcode
    return "exited with code %d" % exitcode


def death_kind(exitcode):
    """A bus error in a worker is /dev/shm running out under its mmap."""
    return SHM if exitcode == -signal.SIGBUS else DIED


def why_no_traceback(exitcode):
    if exitcode == -signal.SIGKILL:
        return ("SIGKILL cannot be caught, so there is no traceback: the kernel's "
                "out-of-memory killer sends it (see dmesg), or another process did")
    if exitcode is not None and exitcode >= 0:
        return "the worker exited without a Python traceback (os._exit or exit() in native code)"
    return "the worker left no traceback"


@functools.lru_cache(maxsize=1)
def _library_dirs():
    paths = sysconfig.get_paths()
    dirs = {paths.get("stdlib"), paths.get("platstdlib"),
            os.path.join(paths.get("purelib") or "", "torch")}
    return tuple(d + os.sep for d in dirs if d)


def where(dump, short=False):
    """The innermost frame of user code in a dump ("file:line in function"; ``short``:
    "name:line"), or None (faulthandler lists the most recent call first)."""
    lines = dump.splitlines()
    if "Traceback (most recent call last):" in dump:
        lines.reverse()
    for line in lines:
        line = line.strip()
        if not line.startswith('File "'):
            continue
        try:
            path, rest = line[len('File "'):].split('", line ', 1)
            number, function = rest.split(" in ", 1)
        except ValueError:
            continue
        if not path.startswith(_library_dirs()) and "autosafe_torch" not in path:
            if short:
                return "%s:%s" % (os.path.basename(path), number.strip(" ,"))
            return "%s:%s in %s" % (path, number.strip(" ,"), function.strip())
    return None


def exception_line(dump, limit=100):
    """The exception line a Python traceback in ``dump`` ends with, or None (a crash)."""
    if "Traceback (most recent call last):" not in dump:
        return None
    for line in reversed(dump.rstrip().splitlines()):
        if line and not line.startswith((" ", "\t")):
            text = line.strip()
            return text if len(text) <= limit else text[:limit - 3] + "..."
    return None


def trim_dump(dump, lines=120):
    """A dump as the log shows it: without the frames a forked worker keeps from
    its parent (below ``_bootstrap``) and the extension modules."""
    kept, skipping = [], False
    for line in dump.rstrip().splitlines():
        if not line.startswith("  File "):
            skipping = False
        if skipping or line.startswith("Extension modules:"):
            continue
        kept.append(line)
        if line.startswith("  File ") and line.endswith(" in _bootstrap"):
            skipping = True
    if len(kept) > lines:
        kept = kept[:lines] + ["... (%d more lines)" % (len(kept) - lines)]
    return "\n".join(kept)


class Failure:
    """One observed failure of a loader's workers: ``kind`` (see the module),
    ``exc`` (what torch raised; None for a hang), the worker to blame where
    known, ``batch`` (the epoch's batches delivered), ``dump`` (a crash's
    traceback, a hang's stacks, or, ``starting``, the traceback of a worker
    that died while it started), ``note`` (why there is none)."""

    __slots__ = ("kind", "exc", "worker", "pid", "status", "batch", "dump", "note",
                 "waited", "starting")

    def __init__(self, kind, exc=None, worker=None, pid=None, status=None, waited=None):
        self.kind, self.exc, self.worker, self.pid = kind, exc, worker, pid
        self.status, self.waited = status, waited
        self.batch, self.dump, self.note = None, "", None
        self.starting = False

    @property
    def unsent(self):
        """What the workers were to be sent did not pickle here: no worker ran."""
        return self.starting and self.pid is None

    def who(self):
        if self.worker is None:
            return "a worker"
        return "worker %d (pid %s)" % (self.worker, self.pid)

    def what(self, room=None):
        """One line: who failed, how, and where in user code. ``room``: a
        headline's characters; the exception is shortened to fit, never who or where."""
        if self.kind == HUNG:
            text = "%s gave no batch for %.1f s, every worker alive" % (
                self.who(), self.waited or 0.0)
        elif self.kind == CUDA:  # the worker's exception follows, from its traceback
            text = "%s touched CUDA" % self.who()
            if not self.dump:
                text += ": %s" % _first_line(self.exc)
        elif self.unsent:
            text = "the workers could not be started: %s" % _first_line(self.exc)
        elif self.status:
            text = "%s %s" % (self.who(), self.status)
        elif self.worker is None:
            text = "%s: %s" % (_NO_WORKER.get(self.kind, "the workers failed"),
                               _first_line(self.exc))
        else:
            text = "%s failed: %s" % (self.who(), _first_line(self.exc))
        if self.kind in (SHM, FDS) and self.exc is not None and self.status:
            text += " (%s)" % _first_line(self.exc)
        if self.starting and not self.unsent:
            text += " while starting"
        found = where(self.dump, short=room is not None) if self.dump else None
        found = ", in %s" % found if found else ""
        limit = 100 if room is None else max(30, room - len(text) - len(found) - 2)
        raised = exception_line(self.dump, limit) if self.dump else None
        if raised:
            text += ": %s" % raised
        return text + found

    def before(self, rung):
        """The record's ``before``."""
        values = {"rung": rung, "batch": self.batch}
        if self.worker is not None:
            values.update(worker=self.worker, pid=self.pid)
        values["status"] = self.status or (
            "hung" if self.kind == HUNG else _first_line(self.exc))
        return values

    def error(self):
        """What the user sees when nothing recovers: torch's own error, or, for a
        hang (torch would wait forever), one that says where it waits."""
        if self.exc is not None:
            return self.exc
        text = "DataLoader %s (autosafe_torch's watchdog, %s)" % (
            self.what(), "AUTOSAFE_TORCH_HANG_TIMEOUT")
        if self.dump:
            text += "\n" + trim_dump(self.dump)
        return RuntimeError(text)

    def __repr__(self):
        return "Failure(%s: %s)" % (self.kind, self.what())


def describe_exception(exc, limit=None):
    """``Type: message`` (its first line, given ``limit``), never raising: its
    type alone where ``str()`` raises (a C library's error object)."""
    try:
        name = type(exc).__name__
    except Exception:
        return "an exception"
    try:
        text = str(exc)
    except Exception:
        return name
    if limit is not None:
        text = text.strip().splitlines()[0] if text.strip() else ""
    return "%s: %s" % (name, text) if text else name


def exception_text(exc):
    try:
        text = str(exc)
    except Exception:
        text = ""
    return text or type(exc).__name__


def _first_line(exc):
    """The line that says what failed: for an error torch re-raised from a
    worker ("Caught RuntimeError in DataLoader worker process 0..."), the
    worker's own last line."""
    if exc is None:
        return ""
    text = [line for line in exception_text(exc).strip().splitlines() if line.strip()]
    if len(text) > 1 and text[0].startswith("Caught "):
        line = text[-1].strip()
        # A remedy of ours that did not hold says so itself: its words, not its type.
        ours = "RemedyFailed: autosafe_torch: "
        return line.split(ours, 1)[1] if ours in line else line
    return "%s: %s" % (type(exc).__name__, text[0] if text else "")
