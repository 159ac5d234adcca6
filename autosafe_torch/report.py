"""Intervention records, the log, the JSON-lines sink and the exit summary.

Every fix becomes one ``Intervention``. The ``autosafe_torch`` logger says
it once per (rule code, call site), so a loader built every epoch logs once;
the count keeps growing in the record. No ``basicConfig``: when neither our
logger nor the root logger has a handler, a stderr handler of our own
speaks; as soon as the application configures logging, it takes over.
"""

import json
import logging
import os
import sys
import threading
import time

from .callsite import user_part
from .config import CONFIG

LOGGER_NAME = "autosafe_torch"
logger = logging.getLogger(LOGGER_NAME)

# Field names of a JSON-lines object; documented in the README, keep stable.
JSON_FIELDS = ("time", "pid", "rank", "code", "slug", "action", "strategy",
               "call_site", "before", "after", "why", "fix")
# Added to the object only when the launcher (torchrun) set them.
JSON_OPTIONAL_FIELDS = ("local_rank", "world_size")


def _env_int(name):
    """An integer the launcher put in the environment (RANK...), or None when
    unset or not an integer (torch itself refuses such a value)."""
    value = os.environ.get(name)
    if value is None:
        return None
    try:
        return int(value.strip())
    except ValueError:
        return None

_lock = threading.Lock()
_records = {}          # (code, call_site) -> Intervention
_errors_logged = set()
_summary_pid = None


class Intervention:
    """One fix (or, in warn mode, one fix that would have been made)."""

    __slots__ = ("code", "slug", "before", "after", "why", "fix", "call_site",
                 "strategy", "action", "pid", "rank", "local_rank", "world_size", "time",
                 "count")

    def __init__(self, code, slug, before, after, why, fix, call_site,
                 strategy=None, action="fixed"):
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
        self.rank = _env_int("RANK")
        self.local_rank = _env_int("LOCAL_RANK")
        self.world_size = _env_int("WORLD_SIZE")
        self.time = time.time()
        self.count = 1

    def as_dict(self):
        out = {name: getattr(self, name) for name in JSON_FIELDS}
        for name in JSON_OPTIONAL_FIELDS:
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out

    def message(self):
        if self.after:
            verb = "would change" if self.action == "would-fix" else "changed"
            change = ", ".join("%s %s -> %s" % (k, _short(self.before.get(k)), _short(v))
                               for k, v in self.after.items())
        else:  # a repair, or advice: no argument changes
            verb = {"would-fix": "would act on", "advised": "advice, nothing changed, on"
                    }.get(self.action, "acted on")
            change = ", ".join("%s %s" % (k, _short(v)) for k, v in self.before.items())
        strategy = " [strategy: %s]" % self.strategy if self.strategy else ""
        return "%s %s at %s: %s %s: %s%s. Permanent fix: %s" % (
            self.code, self.slug, self.call_site, verb, change, self.why,
            strategy, self.fix)

    def __repr__(self):
        return "Intervention(%s)" % self.message()


def _short(value, limit=80):
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _FallbackStderrHandler(logging.StreamHandler):
    """Speaks only while the application has configured no handler."""

    def __init__(self):
        super().__init__(sys.stderr)
        self.setFormatter(logging.Formatter("%(message)s"))

    def emit(self, record):
        if logging.getLogger().handlers or len(logger.handlers) > 1:
            return  # the application's handlers (root's, or ours) take it
        self.stream = sys.stderr  # follow redirections (pytest capsys, tests)
        super().emit(record)


_fallback = _FallbackStderrHandler()
logger.addHandler(_fallback)
logger.setLevel(logging.DEBUG if CONFIG.debug else logging.INFO)


def _prefix():
    rank = os.environ.get("RANK")
    where = "pid %d" % os.getpid() if rank is None else "pid %d rank %s" % (os.getpid(), rank)
    return "autosafe_torch[%s]: " % where


def log(level, message, *args):
    """Our one way to speak; honours QUIET (errors still go out)."""
    if CONFIG.quiet and level < logging.ERROR:
        return
    logger.log(level, _prefix() + message, *args)


def record(intervention):
    """Keep, log once per (code, call site), and write the JSON sink."""
    # The user's line: a loader a framework re-makes from the user's is one mistake.
    key = (intervention.code, user_part(intervention.call_site))
    with _lock:
        known = _records.get(key)
        if known is not None:
            known.count += 1
            return known
        _records[key] = intervention
        _arm_summary()
    # A spawned DataLoader worker repeats the parent's fixes for itself (cv2 is
    # imported afresh there): said once, by the parent; a worker only under DEBUG.
    log(logging.DEBUG if _in_worker_process() else logging.WARNING, "%s",
        intervention.message())
    _write_json(intervention)
    return intervention


def count_again(recorded):
    """One more occurrence of each of these already recorded interventions
    (``record``'s count, for the caller that kept them: autocast every step)."""
    with _lock:
        for intervention in recorded:
            intervention.count += 1


def _in_worker_process():
    """True in a process started by multiprocessing (a DataLoader worker)."""
    mp_process = sys.modules.get("multiprocessing.process")
    try:
        return mp_process is not None and mp_process.parent_process() is not None
    except Exception:
        return False


def _write_json(intervention):
    path = CONFIG.log_file
    if not path:
        return
    try:
        line = json.dumps(intervention.as_dict(), default=repr, sort_keys=True)
    except Exception as exc:
        internal_error("JSON log record", exc)
        return
    try:
        with _lock, open(path, "a", encoding="utf-8") as sink:
            sink.write(line + "\n")
    except OSError as exc:
        # The user's configuration (checked when read; the file system may
        # have changed since): say so once, plainly, and stop writing. The
        # fix this record describes was applied.
        if CONFIG.log_file == path:
            CONFIG.log_file = None
            log(logging.ERROR, "cannot write the JSON log %s (%s: %s); the JSON log is off "
                "for this process, the fixes still apply", path, type(exc).__name__,
                exc.strerror or exc)


def interventions():
    """The records of this process, in the order they were first made."""
    with _lock:
        return list(_records.values())


def clear():
    with _lock:
        _records.clear()
        _errors_logged.clear()
    # and the repeats engine.settle_repeated counts into the records just dropped
    engine = sys.modules.get(__package__ + ".engine")
    if engine is not None:
        engine.forget_repeats()


def internal_error(where, exc):
    """An error of ours: log it once per place, traceback under DEBUG."""
    key = (where, type(exc).__name__)
    if key in _errors_logged:
        return
    _errors_logged.add(key)
    try:
        log(logging.ERROR, "internal error in %s (%s: %s); the original call ran "
            "unchanged. Please report it; AUTOSAFE_TORCH_DEBUG=1 shows the traceback.",
            where, type(exc).__name__, exc)
        if CONFIG.debug:
            logger.error("traceback", exc_info=(type(exc), exc, exc.__traceback__))
    except Exception:
        pass


def _arm_summary():
    global _summary_pid
    if _summary_pid == os.getpid():
        return
    _summary_pid = os.getpid()
    import atexit
    atexit.register(_summary)


def summary_lines():
    per_code = {}
    for rec in interventions():
        entry = per_code.setdefault(rec.code, [rec.slug, 0, 0, rec.action])
        entry[1] += rec.count
        entry[2] += 1
    verbs = {"would-fix": "would fix", "advised": "advised"}
    return ["%s %s: %s %d time(s) at %d call site(s)" % (
        code, slug, verbs.get(action, "fixed"), n, sites)
        for code, (slug, n, sites, action) in sorted(per_code.items())]


def _summary():
    if _summary_pid != os.getpid() or _in_worker_process():
        return  # a forked child inherited the registration; workers say nothing
    try:
        lines = summary_lines()
        if lines:
            log(logging.INFO, "summary: %s", "; ".join(lines))
    except Exception:
        pass
