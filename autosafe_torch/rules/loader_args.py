"""DataLoader arguments that only make sense with worker processes.

PyTorch rejects them when ``num_workers=0`` (read from torch's
``dataloader.py``: the ``__init__`` checks, the ``multiprocessing_context``
setter and ``_SingleProcessDataLoaderIter``), or warns about them on every
epoch. With no workers they have no effect, so dropping them cannot change a
single batch.

Each rule fires only for a value that is valid but for the missing workers:
a negative, wrong-typed or otherwise invalid value reaches torch's own error
untouched (``timeout=-1`` is the user's mistake, and torch says so).
"""

import numbers


from . import brief, rule

GROUP = "dataloader"


@rule("DL101", "prefetch-without-workers", GROUP,
      "prefetch_factor given with num_workers=0: reset to the default",
      "ValueError: prefetch_factor option could only be specified in multiprocessing."
      "let num_workers > 0 to enable multiprocessing, otherwise set prefetch_factor to None.",
      "pass prefetch_factor only when num_workers > 0",
      at="dataloader.init")
def prefetch_without_workers(args, ctx):
    default = ctx.defaults.get("prefetch_factor")
    value = args["prefetch_factor"]
    if args["num_workers"] == 0 and value != default and _count(value) and value >= 1:
        return prefetch_without_workers.rule.finding(
            {"prefetch_factor": args["prefetch_factor"]}, {"prefetch_factor": default},
            "prefetching happens in worker processes and there are none",
            done="prefetch_factor %s -> %s: num_workers=0" % (brief(value), brief(default)))


@rule("DL102", "persistent-without-workers", GROUP,
      "persistent_workers=True with num_workers=0: set to False",
      "ValueError: persistent_workers option needs num_workers > 0",
      "pass persistent_workers=num_workers > 0",
      at="dataloader.init")
def persistent_without_workers(args, ctx):
    if args["num_workers"] == 0 and _flag(args["persistent_workers"]):
        return persistent_without_workers.rule.finding(
            {"persistent_workers": args["persistent_workers"]}, {"persistent_workers": False},
            "there are no workers to keep alive",
            done="persistent_workers %s -> False: num_workers=0"
            % brief(args["persistent_workers"]))


@rule("DL103", "context-without-workers", GROUP,
      "multiprocessing_context given with num_workers=0: set to None",
      "ValueError: multiprocessing_context can only be used with multi-process "
      "loading (num_workers > 0), but got num_workers=0",
      "pass multiprocessing_context only when num_workers > 0",
      at="dataloader.init")
def context_without_workers(args, ctx):
    if args["num_workers"] == 0 and _valid_context(args["multiprocessing_context"]):
        return context_without_workers.rule.finding(
            {"multiprocessing_context": args["multiprocessing_context"]},
            {"multiprocessing_context": None},
            "no worker processes are started, so no start method is used",
            done="multiprocessing_context %s -> None: num_workers=0"
            % brief(args["multiprocessing_context"]))


@rule("DL107", "timeout-without-workers", GROUP,
      "timeout > 0 with num_workers=0: set to 0",
      "AssertionError: _SingleProcessDataLoaderIter requires timeout == 0 "
      "(a bare AssertionError on torch 2.0), at the start of every epoch",
      "pass timeout only when num_workers > 0",
      at="dataloader.init")
def timeout_without_workers(args, ctx):
    timeout = args["timeout"]
    if args["num_workers"] == 0 and isinstance(timeout, numbers.Real) \
            and not isinstance(timeout, bool) and timeout > 0:
        return timeout_without_workers.rule.finding(
            {"timeout": args["timeout"]}, {"timeout": 0},
            "timeout bounds the wait for a worker's batch and there are no workers",
            done="timeout %s -> 0: num_workers=0" % brief(timeout))


@rule("DL106", "zero-prefetch-with-workers", GROUP,
      "prefetch_factor=0 with workers: use the default (2)",
      "AssertionError (prefetch_factor > 0) when the first iterator is created",
      "pass prefetch_factor >= 1, or leave it unset",
      at="dataloader.init")
def zero_prefetch_with_workers(args, ctx):
    if args["num_workers"] > 0 and _count(args["prefetch_factor"]) \
            and args["prefetch_factor"] == 0:
        return zero_prefetch_with_workers.rule.finding(
            {"prefetch_factor": 0}, {"prefetch_factor": 2},
            "each worker must be allowed at least one batch in flight; 2 is PyTorch's default",
            done="prefetch_factor 0 -> 2 (torch's default): a worker needs a batch in flight")


@rule("DL105", "pin-memory-without-accelerator", GROUP,
      "pin_memory=True with no usable accelerator (or on MPS), where torch warns "
      "about it: set to False",
      "UserWarning every epoch: 'pin_memory' argument is set as true but no "
      "accelerator is found, then device pinned memory won't be used. "
      "(on MPS: ... but not supported on MPS now)",
      "pass pin_memory=torch.cuda.is_available()",
      at="dataloader.init")
def pin_memory_without_accelerator(args, ctx):
    facts = ctx.facts
    if args["pin_memory"] and (facts.accelerator == "mps" or (
            facts.accelerator is None and facts.pin_memory_warns)):
        where = "on MPS pinned memory is not supported" if facts.accelerator == "mps" \
            else "there is no accelerator to copy batches to"
        return pin_memory_without_accelerator.rule.finding(
            {"pin_memory": True}, {"pin_memory": False}, where,
            done="pin_memory True -> False: %s" % (
                "MPS does not pin memory" if facts.accelerator == "mps" else "no accelerator"))


def _count(value):
    """An int (not a bool): what torch takes as a count."""
    return isinstance(value, int) and not isinstance(value, bool)


def _flag(value):
    return value is True or (_count(value) and value == 1)


def _valid_context(context):
    """A start method this platform has, or a multiprocessing context object;
    anything else is torch's to reject."""
    import multiprocessing

    if isinstance(context, str):
        return context in multiprocessing.get_all_start_methods()
    return context is not None and callable(getattr(context, "get_start_method", None))
