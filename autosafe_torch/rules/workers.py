"""Worker hazards: the start method, what travels to workers, the ladder.

DL104 is decided at construction (the worker count). The others are
decided when an iterator is made, because the start method can change
between construction and iteration: ``plan(view, facts, enabled)`` looks at
a snapshot of the loader and returns Findings; the patch applies them.

The ladder for a loader whose workers cannot start as asked (keep the first
rung that works; every rung yields the batches of a ``num_workers=0`` run):

1. repair: read-only files travel by path, lambdas/local functions and
   interactive-``__main__`` classes by value (``repairs``);
2. another start method: fork on Linux where safe (no CUDA context, no
   live locks or thread pools in the dataset), spawn where all pickles;
3. thread workers, for a map-style dataset that holds no file or
   connection (threads share them);
4. ``num_workers=0``.
"""

import ast
import os
import sys

from . import declare, rule

GROUP = "dataloader"
SAFE_FORK_PLATFORMS = ("linux",)


# -- DL104, at construction ----------------------------------------------------

@rule("DL104", "too-many-workers", GROUP,
      "num_workers above the CPUs usable (affinity and cgroup quota): clamp, where "
      "the batches cannot depend on the worker count (map-style, in order, no "
      "worker_init_fn); otherwise advise only",
      "UserWarning: This DataLoader will create N worker processes in total. Our "
      "suggested max number of worker in current system is M ... might get "
      "DataLoader running slow or even freeze; oversubscription in containers, "
      "whose CPU quota PyTorch's check ignores",
      "num_workers=min(wanted, len(os.sched_getaffinity(0))) and the container's CPU quota")
def too_many_workers(values, facts, defaults):
    wanted, usable = values["num_workers"], facts.cpus_usable
    if not wanted or wanted <= usable:
        return None
    before = {"num_workers": wanted}
    if _count_cannot_change_batches(values):
        return too_many_workers.rule.finding(
            before, {"num_workers": usable},
            "only %d CPU(s) are usable here; more workers only compete for them" % usable,
            strategy="clamp")
    return too_many_workers.rule.finding(
        before, {}, "only %d CPU(s) are usable here, but the batches may depend on the "
        "worker count (IterableDataset, in_order=False or a worker_init_fn): left as is"
        % usable, strategy="advice")


def _count_cannot_change_batches(values):
    from torch.utils.data import IterableDataset

    return (not isinstance(values["dataset"], IterableDataset)
            and values.get("in_order", True) and values["worker_init_fn"] is None)


CHECKS = (too_many_workers,)


# -- at iteration ---------------------------------------------------------------

DL201 = declare(
    "DL201", "unpicklable-dataset", GROUP,
    "spawn/forkserver workers and a dataset that does not pickle: the repair ladder "
    "(reopen read-only files per worker, else fork, threads, num_workers=0)",
    "TypeError: cannot pickle '_io.BufferedReader' object (also 'sqlite3.Connection', "
    "h5py and lmdb handles, '_thread.lock')",
    "open files lazily in __getitem__ (or in worker_init_fn), not in __init__")
DL202 = declare(
    "DL202", "local-function-to-workers", GROUP,
    "lambda or local function as collate_fn/worker_init_fn under spawn/forkserver: "
    "pickled by value (cloudpickle)",
    "AttributeError: Can't pickle local object 'main.<locals>.<lambda>' (PicklingError "
    "on older Python)",
    "define collate_fn/worker_init_fn at module level")
DL203 = declare(
    "DL203", "interactive-main-class", GROUP,
    "dataset class defined in an interactive __main__ (notebook, -c, stdin) under "
    "spawn/forkserver: pickled by value",
    "AttributeError: Can't get attribute 'DS' on <module '__main__' (built-in)>",
    "move the dataset class into an importable module")
DL204 = declare(
    "DL204", "unguarded-main", GROUP,
    "workers started from unguarded top-level code of __main__ (or a script read from "
    "stdin) under spawn/forkserver: "
    "fork where safe, else threads, else num_workers=0",
    "RuntimeError: An attempt has been made to start a new process before the current "
    "process has finished its bootstrapping phase. (BrokenPipeError on Windows)",
    "put the training code under if __name__ == \"__main__\":")
DL205 = declare(
    "DL205", "fork-after-cuda", GROUP,
    "fork workers after CUDA was initialised in the parent: spawn where everything "
    "pickles, else threads, else num_workers=0",
    "RuntimeError: Cannot re-initialize CUDA in forked subprocess. To use CUDA with "
    "multiprocessing, you must use the 'spawn' start method; CUDA error: initialization error",
    "pass multiprocessing_context='spawn' (and keep CUDA out of the dataset)")
DL206 = declare(
    "DL206", "fork-on-macos", GROUP,
    "fork workers on macOS: spawn where everything pickles, else threads, else "
    "num_workers=0",
    "objc[...]: +[NSNumber initialize] may have been in progress in another thread when "
    "fork() was called. Crashing instead.",
    "leave macOS's default start method (spawn) alone")
DL207 = declare(
    "DL207", "shared-file-offset", GROUP,
    "fork workers and a dataset holding an open file it seeks and reads: each worker "
    "reopens it (an injected worker_init_fn that then calls yours)",
    "silently wrong samples: forked workers share one file offset",
    "open the file in worker_init_fn or lazily in __getitem__")


class LoaderView:
    """What the worker decision looks at, read off a DataLoader."""

    __slots__ = ("num_workers", "start_method", "dataset", "collate_fn", "worker_init_fn",
                 "iterable", "main_guarded")

    def __init__(self, num_workers, start_method, dataset, collate_fn=None,
                 worker_init_fn=None, iterable=False, main_guarded=True):
        self.num_workers = num_workers
        self.start_method = start_method
        self.dataset = dataset
        self.collate_fn = collate_fn
        self.worker_init_fn = worker_init_fn
        self.iterable = iterable
        self.main_guarded = main_guarded


def plan(view, facts, enabled=lambda code: True):
    """Findings for one loader about to start workers (empty: start as asked)."""
    if not view.num_workers:
        return []
    method = view.start_method
    if method in ("spawn", "forkserver"):
        if not view.main_guarded:
            return _fallback(DL204, view, facts, enabled, "workers are started from top-level "
                             "code of __main__ that %s re-runs in every worker" % method,
                             allow_spawn=False)
        return _for_pickling(view, facts, enabled, method)
    if method == "fork":
        if facts.platform == "darwin" and enabled("DL206"):
            return _away_from_fork(DL206, view, facts, enabled,
                                   "fork is unsafe on macOS (Objective-C runtime)")
        if facts.cuda_initialized and enabled("DL205"):
            return _away_from_fork(DL205, view, facts, enabled,
                                   "CUDA is initialised in this process and cannot be "
                                   "used in forked children")
        return _reopen_shared_files(view, enabled)
    return []


def _for_pickling(view, facts, enabled, method):
    repaired = _repairs(view, enabled)
    if repaired is not None:
        return repaired
    return _fallback(DL201, view, facts, enabled, None)


def _repairs(view, enabled):
    """Rung 1: the repairs that make every part pickle, as findings; None if
    some part cannot be repaired (or no part needed it: then [])."""
    from .. import probe, repairs

    findings, parts = [], {"dataset": view.dataset, "collate_fn": view.collate_fn,
                           "worker_init_fn": view.worker_init_fn}
    planned_files, planned_classes = False, []
    for _ in range(16):  # one failure is found per probe; a dataset has few kinds
        failures = [r for name, part in parts.items() if part is not None
                    for r in [probe.probe(part, name)] if not r.ok]
        if not failures:
            return findings
        failure = failures[0]
        value, top = failure.value, failure.path.split(".")[0].split("[")[0]
        by_value = _by_value(parts.get(top), value) if top in (
            "collate_fn", "worker_init_fn") and enabled("DL202") else None
        if by_value is not None:
            findings.append(DL202.finding({top: parts[top]}, {top: by_value},
                                          "%s: %s" % (failure.path, failure.error),
                                          strategy="by-value"))
            parts[top] = by_value
            continue
        if repairs.file_kind(value) == repairs.READONLY and not planned_files \
                and enabled("DL201"):
            planned_files = True
            repairs.install_reducers()  # only turns this failure into a reopen by path
            findings.append(DL201.finding(
                {"file": failure.path}, {}, failure.error,
                strategy="repair: reopen read-only files by path in each worker"))
            continue
        cls = value if isinstance(value, type) else type(value)
        if cls.__module__ == "__main__" and probe.interactive_main() \
                and cls not in planned_classes and enabled("DL203"):
            planned_classes.append(cls)
            repairs.register_by_value_class(cls)
            findings.append(DL203.finding({"class": "%s at %s" % (cls.__qualname__, failure.path)},
                                          {}, failure.error, strategy="by-value"))
            continue
        return None
    return None


def _by_value(part, failing):
    """``part`` (a collate_fn or worker_init_fn) with ``failing``, the function
    that does not pickle, sent by value; None when ``failing`` is not that
    function nor the user's own inside a worker_init_fn of ours."""
    from .. import repairs, workerinit

    if failing is part and callable(part):
        return repairs.by_value(part)
    if failing is workerinit.user_function(part) and callable(failing):
        return workerinit.with_user_function(part, repairs.by_value(failing))
    return None


def _fork_is_safe(view, facts):
    import multiprocessing

    from .. import repairs

    if facts.platform not in SAFE_FORK_PLATFORMS or facts.cuda_initialized:
        return False
    if "fork" not in multiprocessing.get_all_start_methods():
        return False
    return not repairs.live_threading_objects(view.dataset)


def _threads_are_safe(view):
    """Threads share the dataset object: no files, no connections, map-style."""
    from .. import objwalk, repairs

    if view.iterable:
        return False
    if repairs.find_files(view.dataset, items=objwalk.SAMPLE_ITEMS):
        return False
    sqlite3 = sys.modules.get("sqlite3")
    if sqlite3 is not None:
        for _path, value, _edge in objwalk.walk(view.dataset, items=objwalk.SAMPLE_ITEMS):
            if isinstance(value, sqlite3.Connection):
                return False
    return True


def _fallback(code_rule, view, facts, enabled, why, allow_spawn=True):
    """Rungs 2-4 for a loader that cannot start as asked."""
    if not enabled(code_rule.code):
        return []
    if why is None:
        from .. import probe

        failures = probe.probe_loader_parts(view.dataset, view.collate_fn, view.worker_init_fn)
        why = "; ".join("%s: %s" % (f.path, f.error) for f in failures) or "does not pickle"
    if _fork_is_safe(view, facts):
        findings = [code_rule.finding({"multiprocessing_context": view.start_method},
                                      {"multiprocessing_context": "fork"}, why,
                                      strategy="start method: fork")]
        forked = LoaderView(view.num_workers, "fork", view.dataset, view.collate_fn,
                            view.worker_init_fn, view.iterable)
        return findings + _reopen_shared_files(forked, enabled)
    return [_threads_or_zero(code_rule, view, why)]


def _away_from_fork(code_rule, view, facts, enabled, why):
    spawned = LoaderView(view.num_workers, "spawn", view.dataset, view.collate_fn,
                         view.worker_init_fn, view.iterable, view.main_guarded)
    if view.main_guarded:
        repaired = _repairs(spawned, enabled)
        if repaired is not None:
            return [code_rule.finding({"multiprocessing_context": "fork"},
                                      {"multiprocessing_context": "spawn"}, why,
                                      strategy="start method: spawn")] + repaired
    return [_threads_or_zero(code_rule, view, why)]


def _threads_or_zero(code_rule, view, why):
    if _threads_are_safe(view):
        return code_rule.finding({"num_workers": view.num_workers},
                                 {"num_workers": 0, "thread_workers": view.num_workers}, why,
                                 strategy="thread workers")
    return code_rule.finding({"num_workers": view.num_workers}, {"num_workers": 0}, why,
                             strategy="num_workers=0")


def _reopen_shared_files(view, enabled):
    from .. import objwalk, repairs
    from ..workerinit import with_step

    if not enabled("DL207"):
        return []
    files = [f for f in repairs.find_files(view.dataset, items=objwalk.SAMPLE_ITEMS)
             if f.kind == repairs.READONLY]
    if not files:
        return []
    init = with_step(view.worker_init_fn, repairs.reopen_files_in_worker)
    if init is view.worker_init_fn:
        return []  # already reopening
    return [DL207.finding({"worker_init_fn": view.worker_init_fn}, {"worker_init_fn": init},
                          "forked workers would share one offset per file (%s)"
                          % ", ".join(f.path for f in files),
                          strategy="reopen in each worker",
                          apply=lambda: repairs.remember_file_offsets(view.dataset))]


# -- DL204: is __main__'s top level guarded? ------------------------------------

def main_is_guarded(frame):
    """False when a top-level frame of a __main__ script file is on the stack at
    a line outside ``if __name__ == "__main__":`` (spawn would re-run it), or
    when __main__ names a file that is not there (a script read from stdin:
    spawn children fail to run '<stdin>')."""
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    if main_file and not os.path.isfile(main_file):
        return False
    while frame is not None:
        g = frame.f_globals
        if frame.f_code.co_name == "<module>" and g.get("__name__") == "__main__":
            path = g.get("__file__")
            if path and os.path.isfile(path):
                return frame.f_lineno in _guarded_lines(path, os.path.getmtime(path))
            return True
        frame = frame.f_back
    return True


_guard_cache = {}


def _guarded_lines(path, mtime):
    key = (path, mtime)
    if key not in _guard_cache:
        with open(path, "rb") as f:
            tree = ast.parse(f.read(), path)
        lines = set()
        for node in tree.body:
            if isinstance(node, ast.If) and _is_main_test(node.test):
                for inner in node.body:
                    lines.update(range(inner.lineno, (inner.end_lineno or inner.lineno) + 1))
        _guard_cache[key] = frozenset(lines)
    return _guard_cache[key]


def _is_main_test(test):
    if not isinstance(test, ast.Compare) or len(test.comparators) != 1:
        return False
    sides = (test.left, test.comparators[0])
    names = [s for s in sides if isinstance(s, ast.Name) and s.id == "__name__"]
    consts = [s for s in sides if isinstance(s, ast.Constant) and s.value == "__main__"]
    return bool(names and consts) and isinstance(test.ops[0], ast.Eq)
