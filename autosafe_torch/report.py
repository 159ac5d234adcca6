"""Intervention records, the log, the JSON-lines sink and the exit summary.

Every fix becomes one ``Intervention``, said once per (rule code, call site)
(a loader built every epoch: once; the record counts). The lines go to stderr
(and the JSON log), never into the application's own logging (our logger does
not propagate: ``logging.basicConfig(filename="train.log")`` keeps its file);
a handler put on the ``autosafe_torch`` logger itself gets them too. A person
reads a line in the convention of compilers and linters::

    train.py:48: DL201 unpicklable-dataset: dataset.fh (an open file) reopened by path in each of 2 workers
      fix: open files lazily in __getitem__ (or in worker_init_fn), not in __init__

the user's file:line (relative under the working directory; ``Cell In[4],
line 6`` in a notebook), the rule, what was done to what, and the permanent
fix. A finding that only makes another one fast (DL209) is a clause of that
line. The details (before/after, strategy, rung, why) go to the JSON log
and, with ``AUTOSAFE_TORCH_DEBUG=1``, to the lines below the record.
"""  # noqa: E501 - the record above is one line, quoted whole

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import errno
import json
import logging
import os
import re
import sys
import textwrap
import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Callable

from .callsite import user_part
from .config import CONFIG
from .inspection.failures import exception_text
from .inspection.mainmodule import in_notebook

if TYPE_CHECKING:
    from .rung import Rung

logger = logging.getLogger("autosafe_torch")

# Field names of a JSON-lines object; documented in docs/reading-the-log.md, keep stable.
JSON_FIELDS = ("time", "pid", "rank", "code", "slug", "action", "strategy",
               "call_site", "cwd", "before", "after", "why", "fix", "done")
# Added to the object only when the launcher (torchrun) set them.
JSON_OPTIONAL_FIELDS = ("local_rank", "world_size")


@dataclasses.dataclass(frozen=True)
class Said:
    """What the workers said they did, for a record made from it (what
    ``Finding.needed`` may return): its words and what it adds to ``after``."""

    done: str
    after: dict[str, Any]


# Finding.needed: False, nothing was needed (no record); True, as planned; Said: as done.
Needed = Callable[[], "bool | Said"]


def _env_int(name: str) -> int | None:
    """An integer the launcher put in the environment (RANK...), or None when
    unset or not an integer (torch itself refuses such a value)."""
    try:
        return int(os.environ[name].strip())
    except (KeyError, ValueError):
        return None


_lock = threading.Lock()
# (code, call site, subject) -> Intervention; (code, call site) said on stderr
_records: dict[tuple[str, str, int | None], Intervention] = {}
_said_at: set[tuple[str, str]] = set()
_errors_logged: set[tuple[str, str]] = set()
_summary_pid: int | None = None
# JSON lines not yet written for want of a descriptor (EMFILE, ENFILE: DL213's
# hazard), with the pid that made them: written before the next line, or at exit.
_unwritten: list[tuple[int, str]] = []


class Intervention:
    """One fix (or, in warn mode, one fix that would have been made)."""

    __slots__ = ("code", "slug", "before", "after", "why", "fix", "call_site",
                 "strategy", "action", "pid", "rank", "local_rank", "world_size", "time",
                 "count", "done", "clauses", "said", "rung", "subject", "needed")

    def __init__(self, code: str, slug: str, before: dict[str, Any], after: dict[str, Any],
                 why: str, fix: str, call_site: str, strategy: str | None = None,
                 action: str = "fixed", done: str | None = None,
                 rung: Rung | None = None) -> None:
        self.code = code
        self.slug = slug
        self.before = before
        self.after = after
        self.why = why
        self.fix = fix
        self.call_site = call_site
        self.strategy = strategy
        self.action = action
        self.pid = os.getpid()
        self.rank, self.local_rank, self.world_size = (
            _env_int(name) for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
        self.time = time.time()
        self.count = 1
        self.done = done or code
        self.clauses: list[Intervention] = []  # said on this one's line (DL209 on DL201's)
        self.said = False   # said on another's line
        self.rung = rung    # the ladder's rung its finding chose (rung.Rung), or None
        # what it was done to (a loader: id), where one site serves several; None: the site
        self.subject: int | None = None
        self.needed: Needed | None = None  # asked before a fix made in the workers is recorded

    def failed(self, why: str) -> None:
        """This fix did not hold (a remedy a worker could not apply, a start
        that came out otherwise): the record says so, and what happened."""
        self.action = "failed"
        self.why = "%s; it was to be: %s" % (why, self.done)
        self.done = "did not hold: " + why  # its clauses fail with it, on its line

    def as_dict(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in JSON_FIELDS if name != "cwd"}
        # The call site as the stderr line shows it; ``cwd`` resolves a relative path.
        out["call_site"] = shown_site(self.call_site)
        out["cwd"] = None
        with contextlib.suppress(OSError):
            out["cwd"] = os.getcwd()
        out.update((name, getattr(self, name)) for name in JSON_OPTIONAL_FIELDS
                   if getattr(self, name) is not None)
        return out

    def headline(self) -> str:
        """``path:line: CODE slug: what was done to what``."""
        said_with = [] if self.action == "failed" else [c.done for c in self.clauses]
        text = "; ".join([self.done] + said_with)
        if self.action in NOT_APPLIED:
            text = NOT_APPLIED[self.action] + text
        elif self.action == "advised" and not text.startswith("advice"):
            text = "advice, nothing changed: " + text
        if self.rank is not None:
            text += " (rank %d)" % self.rank
        rule = "%s %s: " % (self.code, self.slug)
        return "%s: %s%s" % (shown_site(self.call_site), rule,
                             shorten_line(without_addresses(_relative_paths(text)),
                                  HEADLINE_LIMIT - len(rule)))

    def message(self) -> str:
        """The record as a person reads it: the headline, then the permanent fix."""
        return "%s\n%s" % (self.headline(), textwrap.fill(
            self.fix, FIX_WIDTH, initial_indent="  fix: ", subsequent_indent="       ",
            break_on_hyphens=False))

    def details(self) -> str:
        """What ``AUTOSAFE_TORCH_DEBUG=1`` adds below the record (as the JSON log has it)."""
        lines = ["  strategy: %s" % self.strategy] if self.strategy else []
        lines += ["  before: %r" % (self.before,), "  after: %r" % (self.after,)]
        if self.why:
            lines.append("  why: %s" % self.why)
        return "\n".join(lines)

    def __repr__(self) -> str:
        return "Intervention(%s)" % self.headline()


# Actions whose fix was not made: what the line says before what it would have done.
NOT_APPLIED = {"would-fix": "not applied (warn mode): ",
               "refused": "refused (AUTOSAFE_TORCH_MODE=strict), not applied: "}

# What a person reads: the headline (beyond the path) and the fix's lines stay
# under 200 characters; the JSON log keeps everything.
HEADLINE_LIMIT = 195
FIX_WIDTH = 100


def shorten_line(text: str, limit: int) -> str:
    """``text`` cut at a word before ``limit`` characters, marked with "...";
    one line (a traceback's first line, never the rest of it)."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    cut = text.rfind(" ", 0, limit - 3)
    return text[: cut if cut > limit // 2 else limit - 3].rstrip(" ,;:") + "..."


_SITE = re.compile(r"^(.+?)(:\d+(?: \(via .*)?)$")


def shown_path(path: str) -> str:
    """``path`` as the user gave it: relative when under the working directory."""
    with contextlib.suppress(OSError, ValueError):
        if os.path.isabs(path):
            cwd = os.getcwd()
            if path.startswith(cwd.rstrip(os.sep) + os.sep):
                return os.path.relpath(path, cwd)
    return path


def _relative_paths(text: str) -> str:
    """Paths under the working directory, in a line's text, made relative."""
    try:
        return text.replace(os.path.join(os.getcwd(), ""), "")
    except OSError:
        return text


def shown_site(site: object) -> str:
    """A call site (``/abs/train.py:48 (via lib.py:3)``) with its path as shown."""
    return _SITE.sub(lambda found: shown_path(found.group(1)) + found.group(2), str(site))


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+|0x[0-9a-fA-F]{6,}")


def without_addresses(text: str) -> str:
    """``<function f at 0x7f...>`` -> ``<function f>``: nothing a person can use."""
    return _ADDRESS.sub(lambda m: "" if m.group(0).startswith(" at ") else "0x...", text)


class _StderrHandler(logging.StreamHandler):
    """Our lines (as they are: the default format) on the stderr of the moment
    (pytest's capsys redirects it), whatever the application configured."""

    stream = property(lambda self: sys.stderr, lambda self, _: None)


logger.addHandler(_StderrHandler())
logger.propagate = False  # never into the application's handlers (the root's)
logger.setLevel(logging.DEBUG if CONFIG.debug else logging.INFO)


def log(level: int, message: str, *args: object, named: bool = True) -> None:
    """Our one way to speak; honours QUIET (errors still go out). ``named``:
    the line begins with ``autosafe_torch:`` (a record: with the user's file:line)."""
    global _tool_named
    if CONFIG.quiet and level < logging.ERROR:
        return
    _tool_named = _tool_named or (named and level >= logging.INFO)
    rank = os.environ.get("RANK")
    prefix = "autosafe_torch: " if rank is None else "autosafe_torch[rank %s]: " % rank
    logger.log(level, (prefix if named else "") + message, *args)


_tool_named = False  # whether a line of this process has named autosafe_torch


def _named_once() -> str:
    """A line under the first record of a process where nothing has named the
    tool and no summary will (a notebook's kernel does not exit): what speaks."""
    global _tool_named
    if _tool_named or not in_notebook():
        return ""  # a script: the summary at exit names it
    _tool_named = True
    return "\n  (autosafe_torch: `autosafe-torch explain CODE` says more; " \
        "%unload_ext autosafe_torch turns it off)"


def record(intervention: Intervention) -> Intervention:
    """Keep, log once per (code, call site), and write the JSON sink. Each
    subject (a loader) at a site has its own record; a repeat of one (the same
    loader, or a site without subjects) counts. A clause (``said``: DL209, on
    its host's line) has no line of its own; its record is kept and written."""
    global _summary_pid
    # The user's line: a loader a framework re-makes from the user's is one mistake.
    site = (intervention.code, user_part(intervention.call_site))
    key = site + (intervention.subject,)
    with _lock:
        known = _records.get(key)
        if known is not None:
            known.count += 1
            return known
        _records[key] = intervention
        first_at_site = site not in _said_at
        _said_at.add(site)
        if _summary_pid != os.getpid():
            _summary_pid = os.getpid()
            atexit.register(_summary)
    # A spawned DataLoader worker repeats the parent's fixes for itself (cv2 is
    # imported afresh there): said once, by the parent; a worker only under DEBUG.
    level = logging.DEBUG if _in_worker_process() else logging.WARNING
    if not intervention.said and first_at_site:
        with _lock:
            intervention.clauses = [c for c in intervention.clauses
                                    if (c.code, user_part(c.call_site)) not in _said_at]
        for clause in intervention.clauses:
            clause.said = True
        log(level, "%s%s", intervention.message(), _named_once(), named=False)
    if CONFIG.debug:
        log(logging.DEBUG, "%s", intervention.details(), named=False)
    if CONFIG.log_file:
        try:
            line = json.dumps(intervention.as_dict(), default=repr, sort_keys=True)
        except Exception as exc:
            internal_error("JSON log record", exc)
        else:
            with _lock:
                _unwritten.append((os.getpid(), line))
            _write_unwritten()
    return intervention


def count_again(recorded: Iterable[Intervention]) -> None:
    """One more occurrence of each of these already recorded interventions
    (``record``'s count, for the caller that kept them: autocast every step)."""
    with _lock:
        for intervention in recorded:
            intervention.count += 1


def _in_worker_process() -> bool:
    """True in a process started by multiprocessing (a DataLoader worker)."""
    mp_process = sys.modules.get("multiprocessing.process")
    try:
        return mp_process is not None and mp_process.parent_process() is not None
    except Exception:
        return False


def _write_unwritten(last: bool = False) -> None:
    """``last``: at exit, where a line not written now never will be."""
    path = CONFIG.log_file
    try:
        with _lock:
            lines = [line for pid, line in _unwritten if pid == os.getpid()]
            if path and lines:
                with open(path, "a", encoding="utf-8") as sink:
                    sink.write("".join(line + "\n" for line in lines))
            _unwritten.clear()  # a forked child's copy of its parent's is the parent's
    except OSError as exc:
        if exc.errno in (errno.EMFILE, errno.ENFILE) and not last:
            return  # kept: the descriptors run out for a while, not the configuration
        # The user's configuration (checked when read; the file system changed since).
        if CONFIG.log_file == path:
            CONFIG.log_file = None
            log(logging.ERROR, "cannot write the JSON log %s (%s: %s); the JSON log is off "
                "for this process, the fixes still apply", path, type(exc).__name__,
                exc.strerror or exc)


def interventions() -> list[Intervention]:
    """The records of this process, in the order they were first made."""
    with _lock:
        return list(_records.values())


def clear() -> None:
    with _lock:
        _records.clear()
        _said_at.clear()
        _errors_logged.clear()
        _unwritten.clear()
    # and the repeats engine.settle_repeated counts into the records just dropped
    engine = sys.modules.get(__package__ + ".engine")
    if engine is not None:
        engine.forget_repeats()


def internal_error(where: str, exc: BaseException) -> None:
    """An error of ours: log it once per place, traceback under DEBUG."""
    key = (where, type(exc).__name__)
    if key in _errors_logged:
        return
    _errors_logged.add(key)
    with contextlib.suppress(Exception):
        log(logging.ERROR, "internal error in %s (%s: %s); the original call ran "
            "unchanged\n  please report it; AUTOSAFE_TORCH_DEBUG=1 shows the traceback",
            where, type(exc).__name__, shorten_line(without_addresses(exception_text(exc)), 100))
        if CONFIG.debug:
            logger.error("traceback", exc_info=(type(exc), exc, exc.__traceback__))


VERBS = (("fixed", "fixed"), ("failed", "did not hold"), ("would-fix", "would fix"),
         ("advised", "advised"))


def summary_line() -> str:
    """One line: the counts by code (and call sites, where more than one), by
    action, and where the JSON log is; "" when nothing was recorded."""
    records = interventions()
    parts = []
    for action, verb in VERBS:
        said = []
        for code in sorted({r.code for r in records if r.action == action}):
            these = [r for r in records if (r.action, r.code) == (action, code)]
            sites = len({user_part(r.call_site) for r in these})
            said.append("%s x%d%s" % (code, sum(r.count for r in these),
                                      " (%d call sites)" % sites if sites > 1 else ""))
        if said:
            parts.append("%s %s" % (verb, ", ".join(said)))
    if not parts:
        return ""
    if CONFIG.log_file:
        parts.append("JSON log: %s" % shown_path(CONFIG.log_file))
    return "summary: " + "; ".join(parts)


def _summary() -> None:
    _write_unwritten(last=True)  # before the summary line, which names the log
    if _summary_pid != os.getpid() or _in_worker_process():
        return  # a forked child inherited the registration; workers say nothing
    with contextlib.suppress(Exception):
        line = summary_line()
        if line:
            log(logging.INFO, "%s", line)
