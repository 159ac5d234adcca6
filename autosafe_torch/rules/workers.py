"""Worker hazards: the start method, what travels to workers, the ladder.

DL104 is decided at construction (the worker count). The others are
checked at ``dataloader.iter``, when an iterator is made, because the start
method can change between construction and iteration. They run in the order
they are declared here, each seeing the loader's arguments as the earlier
ones changed them: a rule that moves the loader to fork (DL204, DL201) is
followed by DL207, which looks at what fork means for open files.

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

import sys

from . import rule

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
      "num_workers=min(wanted, len(os.sched_getaffinity(0))) and the container's CPU quota",
      at="dataloader.init")
def too_many_workers(values, ctx):
    facts = ctx.facts
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



# -- at iteration ---------------------------------------------------------------

SPAWNING = ("spawn", "forkserver")


def start_method(args):
    from ..facts import effective_start_method

    return effective_start_method(args["multiprocessing_context"])


def _spawning_workers(args, ctx):
    """Workers started by spawn/forkserver from a guarded main: they get pickles."""
    return args["num_workers"] > 0 and start_method(args) in SPAWNING and ctx.main_guarded()


@rule("DL204", "unguarded-main", GROUP,
      "workers started from unguarded top-level code of __main__ (or a script read from "
      "stdin) under spawn/forkserver: fork where safe, else threads, else num_workers=0",
      "RuntimeError: An attempt has been made to start a new process before the current "
      "process has finished its bootstrapping phase. (BrokenPipeError on Windows)",
      "put the training code under if __name__ == \"__main__\":",
      at="dataloader.iter")
def unguarded_main(args, ctx):
    method = start_method(args)
    if args["num_workers"] > 0 and method in SPAWNING and not ctx.main_guarded():
        return _fallback(unguarded_main, args, ctx, "workers are started from top-level "
                         "code of __main__ that %s re-runs in every worker" % method)


@rule("DL206", "fork-on-macos", GROUP,
      "fork workers on macOS: spawn where everything pickles, else threads, else "
      "num_workers=0",
      "objc[...]: +[NSNumber initialize] may have been in progress in another thread when "
      "fork() was called. Crashing instead.",
      "leave macOS's default start method (spawn) alone",
      at="dataloader.iter")
def fork_on_macos(args, ctx):
    if args["num_workers"] > 0 and start_method(args) == "fork" \
            and ctx.facts.platform == "darwin":
        return _away_from_fork(fork_on_macos, args, ctx,
                               "fork is unsafe on macOS (Objective-C runtime)")


@rule("DL205", "fork-after-cuda", GROUP,
      "fork workers after CUDA was initialised in the parent: spawn where everything "
      "pickles, else threads, else num_workers=0",
      "RuntimeError: Cannot re-initialize CUDA in forked subprocess. To use CUDA with "
      "multiprocessing, you must use the 'spawn' start method; CUDA error: initialization "
      "error",
      "pass multiprocessing_context='spawn' (and keep CUDA out of the dataset)",
      at="dataloader.iter")
def fork_after_cuda(args, ctx):
    if args["num_workers"] > 0 and start_method(args) == "fork" \
            and ctx.facts.cuda_initialized:
        return _away_from_fork(fork_after_cuda, args, ctx,
                               "CUDA is initialised in this process and cannot be used in "
                               "forked children")


@rule("DL202", "local-function-to-workers", GROUP,
      "lambda or local function as collate_fn/worker_init_fn under spawn/forkserver: "
      "pickled by value (cloudpickle)",
      "AttributeError: Can't pickle local object 'main.<locals>.<lambda>' (PicklingError "
      "on older Python)",
      "define collate_fn/worker_init_fn at module level",
      at="dataloader.iter")
def local_function_to_workers(args, ctx):
    if not _spawning_workers(args, ctx):
        return None
    plan = pickling_plan(args, ctx)
    if plan.failures:
        return None  # the ladder (DL201) takes the loader elsewhere
    return [local_function_to_workers.rule.finding(
        {part: args[part]}, {part: new}, why, strategy="by-value")
        for part, (new, why) in plan.by_value.items()]


@rule("DL203", "interactive-main-class", GROUP,
      "dataset class defined in an interactive __main__ (notebook, -c, stdin) under "
      "spawn/forkserver: pickled by value",
      "AttributeError: Can't get attribute 'DS' on <module '__main__' (built-in)>",
      "move the dataset class into an importable module",
      at="dataloader.iter")
def interactive_main_class(args, ctx):
    if not _spawning_workers(args, ctx):
        return None
    plan = pickling_plan(args, ctx)
    if plan.failures or (plan.by_value and not ctx.found("DL202")):
        return None
    from ..remedies import byvalue

    return [interactive_main_class.rule.finding(
        {"class": "%s at %s" % (cls.__qualname__, path)}, why=why, strategy="by-value",
        remedies=[lambda args, cls=cls: byvalue.register_by_value_class(cls)])
        for cls, (path, why) in plan.classes.items()]


@rule("DL201", "unpicklable-dataset", GROUP,
      "spawn/forkserver workers and a dataset that does not pickle: the repair ladder "
      "(reopen read-only files per worker, else fork, threads, num_workers=0)",
      "TypeError: cannot pickle '_io.BufferedReader' object (also 'sqlite3.Connection', "
      "h5py and lmdb handles, '_thread.lock')",
      "open files lazily in __getitem__ (or in worker_init_fn), not in __init__",
      at="dataloader.iter")
def unpicklable_dataset(args, ctx):
    if not _spawning_workers(args, ctx):
        return None
    plan = pickling_plan(args, ctx)
    repaired = not plan.failures and (not plan.by_value or ctx.found("DL202")) \
        and (not plan.classes or ctx.found("DL203"))
    if not repaired:
        return _fallback(unpicklable_dataset, args, ctx, None)
    if plan.files:
        from ..remedies import reopen

        path, why = plan.files
        return unpicklable_dataset.rule.finding(
            {"file": path}, why=why,
            strategy="repair: reopen read-only files by path in each worker",
            remedies=[lambda args: reopen.install_reducers()])
    return None


@rule("DL207", "shared-file-offset", GROUP,
      "fork workers and a dataset holding an open file it seeks and reads: each worker "
      "reopens it (an injected worker_init_fn that then calls yours)",
      "silently wrong samples: forked workers share one file offset",
      "open the file in worker_init_fn or lazily in __getitem__",
      at="dataloader.iter")
def shared_file_offset(args, ctx):
    from ..inspection import holdings, objwalk
    from ..remedies import reopen
    from ..remedies.workerinit import with_step

    if not args["num_workers"] or start_method(args) != "fork":
        return None
    dataset = args["dataset"]
    files = [f for f in holdings.find_files(dataset, items=objwalk.SAMPLE_ITEMS)
             if f.kind == holdings.READONLY]
    if not files:
        return None
    init = with_step(args["worker_init_fn"], reopen.reopen_files_in_worker)
    if init is args["worker_init_fn"]:
        return None  # already reopening
    return shared_file_offset.rule.finding(
        {"worker_init_fn": args["worker_init_fn"]}, {"worker_init_fn": init},
        "forked workers would share one offset per file (%s)" % ", ".join(
            f.path for f in files), strategy="reopen in each worker",
        remedies=[lambda args: reopen.remember_file_offsets(dataset)])


# -- what it takes to pickle the loader's parts ---------------------------------

class PicklingPlan:
    """The repairs that make a loader's parts reach spawn/forkserver workers.

    ``by_value``: part name -> (the part sent by value, why) for a lambda or
    local function as collate_fn/worker_init_fn (DL202); ``classes``: class ->
    (path, why) for classes of an interactive ``__main__`` (DL203); ``files``:
    (path, why) of the first read-only file, when files travel by path (DL201);
    ``failures``: what still does not pickle with all of these (ProbeResults).
    """

    __slots__ = ("by_value", "classes", "files", "failures")

    def __init__(self):
        self.by_value, self.classes, self.files, self.failures = {}, {}, None, []


PARTS = ("dataset", "collate_fn", "worker_init_fn")
MAX_REPAIRS = 16  # one failure is found per probe; a dataset has few kinds


def pickling_plan(args, ctx):
    """The ``PicklingPlan`` for ``args``, cached on ``ctx`` (planning installs
    nothing: the probe tries the planned reducers without registering them)."""
    key = tuple(id(args[name]) for name in PARTS)
    cache = ctx.__dict__.setdefault("pickling_plans", {})
    if key not in cache:
        cache[key] = _plan_pickling({name: args[name] for name in PARTS})
    return cache[key]


def _plan_pickling(parts):
    from ..inspection import holdings, probe
    from ..inspection.mainmodule import interactive_main
    from ..remedies import byvalue, reopen

    plan, planned = PicklingPlan(), {}
    for _ in range(MAX_REPAIRS):
        failures = [r for name, part in parts.items() if part is not None
                    for r in [probe.probe(part, name, planned)] if not r.ok]
        if not failures:
            return plan
        failure = failures[0]
        value, top = failure.value, failure.path.split(".")[0].split("[")[0]
        new = _by_value(parts.get(top), value) if top in ("collate_fn", "worker_init_fn") \
            else None
        cls = value if isinstance(value, type) else type(value)
        why = "%s: %s" % (failure.path, failure.error)
        if new is not None:
            plan.by_value[top] = (new, why)
            parts[top] = new
        elif holdings.file_kind(value) == holdings.READONLY and plan.files is None:
            plan.files = (failure.path, failure.error)
            planned.update(reopen.file_reducers())
        elif cls.__module__ == "__main__" and interactive_main() and cls not in plan.classes:
            plan.classes[cls] = (failure.path, failure.error)
            planned.update(byvalue.class_reducers((cls,)))
        else:
            plan.failures = failures
            return plan
    plan.failures = failures
    return plan


def _by_value(part, failing):
    """``part`` (a collate_fn or worker_init_fn) with ``failing``, the function
    that does not pickle, sent by value; None when ``failing`` is not that
    function nor the user's own inside a worker_init_fn of ours."""
    from ..remedies import byvalue, workerinit

    if failing is part and callable(part):
        return byvalue.by_value(part)
    if failing is workerinit.user_function(part) and callable(failing):
        return workerinit.with_user_function(part, byvalue.by_value(failing))
    return None


# -- rungs 2-4: another start method, threads, no workers -----------------------

def _fork_is_safe(args, facts):
    import multiprocessing

    from ..inspection import holdings

    if facts.platform not in SAFE_FORK_PLATFORMS or facts.cuda_initialized:
        return False
    if "fork" not in multiprocessing.get_all_start_methods():
        return False
    return not holdings.live_threading_objects(args["dataset"])


def _threads_are_safe(args):
    """Threads share the dataset object: no files, no connections, map-style."""
    from torch.utils.data import IterableDataset

    from ..inspection import holdings, objwalk

    dataset = args["dataset"]
    if isinstance(dataset, IterableDataset):
        return False
    if holdings.find_files(dataset, items=objwalk.SAMPLE_ITEMS):
        return False
    sqlite3 = sys.modules.get("sqlite3")
    if sqlite3 is not None:
        for _path, value, _edge in objwalk.walk(dataset, items=objwalk.SAMPLE_ITEMS):
            if isinstance(value, sqlite3.Connection):
                return False
    return True


def _fallback(check, args, ctx, why):
    """Rungs 2-4 for a loader that cannot start as asked."""
    if why is None:
        failures = pickling_plan(args, ctx).failures
        why = "; ".join("%s: %s" % (f.path, f.error) for f in failures) or "does not pickle"
    if _fork_is_safe(args, ctx.facts):
        return check.rule.finding({"multiprocessing_context": start_method(args)},
                                  {"multiprocessing_context": "fork"}, why,
                                  strategy="start method: fork")
    return _threads_or_zero(check, args, why)


def _away_from_fork(check, args, ctx, why):
    if ctx.main_guarded() and not pickling_plan(args, ctx).failures:
        return check.rule.finding({"multiprocessing_context": "fork"},
                                  {"multiprocessing_context": "spawn"}, why,
                                  strategy="start method: spawn")
    return _threads_or_zero(check, args, why)


def _threads_or_zero(check, args, why):
    before, changes = {"num_workers": args["num_workers"]}, {"num_workers": 0}
    if args["timeout"]:
        before["timeout"], changes["timeout"] = args["timeout"], 0  # refused without workers
    if _threads_are_safe(args):
        return check.rule.finding(before, changes, why, strategy="thread workers",
                                  state={"thread_workers": args["num_workers"]})
    return check.rule.finding(before, changes, why, strategy="num_workers=0")
