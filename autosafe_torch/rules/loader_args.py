"""DataLoader arguments that only make sense with worker processes.

PyTorch rejects them when ``num_workers=0`` (torch's ``dataloader.py``:
the ``__init__`` checks, the ``multiprocessing_context`` setter and
``_SingleProcessDataLoaderIter``), or warns about them on every epoch. With
no workers they have no effect, so dropping them cannot change a batch.
Each rule fires only for a value valid but for the missing workers: an
invalid one (``timeout=-1``) reaches torch's own error untouched.
"""

import multiprocessing
import numbers

from . import InitContext, Rewrite, brief, rule

GROUP = "dataloader"

WORKER_ARGUMENT_REWRITE = Rewrite(
    'loader_args', 'site',
    "the argument made conditional on the call's own `num_workers` expression, with the "
    "value the run gave it: `prefetch_factor=4 if NUM_WORKERS > 0 else None`, "
    "`persistent_workers=NUM_WORKERS > 0`; removed where the call gives no workers",
    "`num_workers` is computed at the call (it would be evaluated twice)")


@rule("DL101", "prefetch-without-workers", GROUP,
      summary="prefetch_factor given with num_workers=0: reset to the default",
      prevents=("ValueError: prefetch_factor option could only be specified in "
                "multiprocessing.let num_workers > 0 to enable multiprocessing, "
                "otherwise set prefetch_factor to None."),
      fix="pass prefetch_factor only when num_workers > 0",
      example=("DataLoader(ds, batch_size=32, num_workers=0, prefetch_factor=4)",
               ("DataLoader(ds, batch_size=32, num_workers=workers,\n"
                "           prefetch_factor=4 if workers > 0 else None)")),
      versions=("every supported torch (2.0 to 2.14): DataLoader.__init__ refuses any "
                "prefetch_factor but None without workers (torch 1.x refused any but 2)"),
      rewrite=WORKER_ARGUMENT_REWRITE,
      at="dataloader.init")
def prefetch_without_workers(args, ctx: InitContext):
    default = ctx.defaults.get("prefetch_factor")
    value = args["prefetch_factor"]
    if args["num_workers"] == 0 and value != default and _count(value) and value >= 1:
        return _without_workers(prefetch_without_workers, args, "prefetch_factor", default,
                                "prefetching happens in worker processes and there are none")


@rule("DL102", "persistent-without-workers", GROUP,
      summary="persistent_workers=True with num_workers=0: set to False",
      prevents="ValueError: persistent_workers option needs num_workers > 0",
      fix="pass persistent_workers=num_workers > 0",
      example=("DataLoader(ds, num_workers=0, persistent_workers=True)",
               "DataLoader(ds, num_workers=workers, persistent_workers=workers > 0)"),
      versions="every supported torch (2.0 to 2.14)",
      rewrite=WORKER_ARGUMENT_REWRITE,
      at="dataloader.init")
def persistent_without_workers(args, ctx):
    flag = args["persistent_workers"]
    if args["num_workers"] == 0 and (flag is True or _count(flag) and flag == 1):
        return _without_workers(persistent_without_workers, args, "persistent_workers", False,
                                "there are no workers to keep alive")


@rule("DL103", "context-without-workers", GROUP,
      summary="multiprocessing_context given with num_workers=0: set to None",
      prevents=("ValueError: multiprocessing_context can only be used with multi-process "
                "loading (num_workers > 0), but got num_workers=0"),
      fix="pass multiprocessing_context only when num_workers > 0",
      example=("DataLoader(ds, num_workers=0, multiprocessing_context='spawn')",
               ("DataLoader(ds, num_workers=workers,\n"
                "           multiprocessing_context='spawn' if workers > 0 else None)")),
      versions="every supported torch (2.0 to 2.14)",
      rewrite=WORKER_ARGUMENT_REWRITE,
      at="dataloader.init")
def context_without_workers(args, ctx):
    if args["num_workers"] == 0 and _valid_context(args["multiprocessing_context"]):
        return _without_workers(context_without_workers, args, "multiprocessing_context", None,
                                "no worker processes are started, so no start method is used")


@rule("DL107", "timeout-without-workers", GROUP,
      summary="timeout > 0 with num_workers=0: set to 0",
      prevents=("AssertionError: _SingleProcessDataLoaderIter requires timeout == 0 (a "
                "bare AssertionError on torch 2.0), at the start of every epoch"),
      fix="pass timeout only when num_workers > 0",
      example=("DataLoader(ds, num_workers=0, timeout=60)",
               "DataLoader(ds, num_workers=workers, timeout=60 if workers > 0 else 0)"),
      versions="every supported torch; the message is a bare AssertionError on torch 2.0",
      rewrite=WORKER_ARGUMENT_REWRITE,
      at="dataloader.init")
def timeout_without_workers(args, ctx):
    timeout = args["timeout"]
    if args["num_workers"] == 0 and isinstance(timeout, numbers.Real) \
            and not isinstance(timeout, bool) and timeout > 0:  # type: ignore[operator]  # typeshed's Real lacks >
        return _without_workers(timeout_without_workers, args, "timeout", 0,
                                "timeout bounds the wait for a worker's batch and there are "
                                "no workers")


def _without_workers(check, args, name, new, why):
    done = "%s %s -> %s: num_workers=0" % (name, brief(args[name]), brief(new))
    return check.rule.finding({name: args[name]}, {name: new}, why, done=done)


@rule("DL106", "zero-prefetch-with-workers", GROUP,
      summary="prefetch_factor=0 with workers: use the default (2)",
      prevents="AssertionError (prefetch_factor > 0) when the first iterator is created",
      fix="pass prefetch_factor >= 1, or leave it unset",
      example=("DataLoader(ds, num_workers=2, prefetch_factor=0)",
               "DataLoader(ds, num_workers=2)  # or prefetch_factor >= 1"),
      versions="every supported torch (2.0 to 2.14)",
      at="dataloader.init")
def zero_prefetch_with_workers(args, ctx):
    if args["num_workers"] > 0 and _count(args["prefetch_factor"]) \
            and args["prefetch_factor"] == 0:
        return zero_prefetch_with_workers.rule.finding(
            {"prefetch_factor": 0}, {"prefetch_factor": 2},
            "each worker must be allowed at least one batch in flight; 2 is PyTorch's default",
            done="prefetch_factor 0 -> 2 (torch's default): a worker needs a batch in flight")


@rule("DL105", "pin-memory-without-accelerator", GROUP,
      summary=("pin_memory=True with no usable accelerator (or on MPS), where torch "
               "warns about it: set to False"),
      prevents=("UserWarning every epoch: 'pin_memory' argument is set as true but no "
                "accelerator is found, then device pinned memory won't be used. (on MPS: "
                "... but not supported on MPS now)"),
      fix="pass pin_memory=torch.cuda.is_available()",
      example=("DataLoader(ds, num_workers=2, pin_memory=True)  # on a CPU-only machine",
               "DataLoader(ds, num_workers=2, pin_memory=torch.cuda.is_available())"),
      versions=("torch versions whose DataLoader warns about it (2.13 does, 2.0 does "
                "not): the installed torch is asked, not its version number"),
      rewrite=Rewrite(
        'loader_args', 'site',
        "`pin_memory=torch.cuda.is_available()` (`pin_memory=x and ...` for an expression)",
        "the argument is not written at the call"),
      at="dataloader.init")
def pin_memory_without_accelerator(args, ctx):
    facts = ctx.facts
    mps = facts.accelerator == "mps"
    if args["pin_memory"] and (mps or facts.accelerator is None and facts.pin_memory_warns):
        return pin_memory_without_accelerator.rule.finding(
            {"pin_memory": True}, {"pin_memory": False}, "on MPS pinned memory is not supported"
            if mps else "there is no accelerator to copy batches to",
            done="pin_memory True -> False: %s" % (
                "MPS does not pin memory" if mps else "no accelerator"))


def _count(value):
    """What torch takes as a count: an int, not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def _valid_context(context):
    """A start method this platform has, or a multiprocessing context object."""
    if isinstance(context, str):
        return context in multiprocessing.get_all_start_methods()
    return context is not None and callable(getattr(context, "get_start_method", None))
