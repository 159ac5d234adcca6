"""The ladder: the rungs a loader's workers may run on, in order, with their
conditions, chosen at ``iter()`` (the rules at ``dataloader.iter``) and after
a failure (``recovery``). At ``iter()``, the first that works for workers
that cannot start as asked (each yields the batches of the requested workers
on a safe platform):

1. repair: read-only files and native handles travel by path, local
   functions and interactive-``__main__`` classes by value (planned by
   ``pickling_plan.py``);
2. another start method (``fallback``, ``away_from_fork``): fork on Linux
   where safe (``fork_plan.fork_is_safe``), spawn where all pickles;
3. where no fork is safe (macOS): the dataset built again in each worker
   from its constructor's call (``remedies/rebuild.py``); below fork because
   it runs the user's constructor again, which fork never does;
4. emulated workers, in this process, each with its own copy of the
   dataset, seeds and worker info: exactly the batches asked for.

After a failure of running workers: per kind, the rungs of ``LADDERS``
(``next_rung``), ending on the same last rung.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..inspection import holdings
from ..inspection.failures import CUDA, DIED, FDS, HUNG, MEMORY, REMEDY, SHM
from ..inspection.objwalk import is_a
from ..loaderstate import Kept
from ..rung import Rung
from . import number_of, what_is
from .fork_plan import fork_is_safe, start_method
from .pickling_plan import pickling_plan

if TYPE_CHECKING:
    from . import Check, Finding, IterContext

GROUP = "dataloader"


# -- at iter(): rungs 2-4 --------------------------------------------------------

def fallback(check: Check, args: dict[str, Any], ctx: IterContext, why: str | None) -> Finding:
    fix, reason, refused = None, why, []
    if why is None:
        plan = pickling_plan(args, ctx)
        refused = plan.refused
        why = reason = "; ".join(["%s: %s" % (f.path, f.error) for f in plan.failures]
                                 + refused) or "does not pickle"
        if plan.failures:
            first = plan.failures[0]
            fix = getattr(first, "fix", None)
            reason = "%s: %s" % (first.path, first.error) if fix else \
                "%s (%s) does not pickle" % (first.path, what_is(first.value))
            fix = fix or permanent_fix(first.value)
    if fork_is_safe(args, ctx):
        method = start_method(args)
        return check.rule.finding({"multiprocessing_context": method},
                                  {"multiprocessing_context": "fork"}, why, rung=Rung.FORK,
                                  fix=fix, done="workers started by fork instead of %s: %s"
                                  % (method, reason))
    # refused: said where emulated workers cannot copy it either (NoExactRung)
    return emulated_workers(check, args, why, fix, reason, "; ".join(refused) or None)


def away_from_fork(check: Check, args: dict[str, Any], ctx: IterContext, why: str,
                   repairs: bool = True) -> Finding:
    """Spawn where everything pickles, else emulated workers. ``repairs``:
    whether the repairs that make it pickle can still be made (DL201-DL203
    and DL208 run before DL207 and DL212)."""
    plan = pickling_plan(args, ctx)
    if ctx.main_guarded() and not plan.failures and (repairs or not plan.needs_repair):
        return check.rule.finding({"multiprocessing_context": "fork"},
                                  {"multiprocessing_context": "spawn"}, why, rung=Rung.SPAWN,
                                  done="workers started by spawn instead of fork: " + why)
    return emulated_workers(check, args, why)


def emulated_workers(check: Check, args: dict[str, Any], why: str, fix: str | None = None,
                     reason: str | None = None, not_rebuilt: str | None = None) -> Finding:
    workers = args["num_workers"]
    return check.rule.finding({"num_workers": workers}, why=why, rung=Rung.EMULATED,
                              kept=Kept(emulated_workers=workers, not_rebuilt=not_rebuilt),
                              fix=fix, done="%s emulated in this process, with the batches of "
                              "real ones: %s" % (number_of(workers, "worker"), reason or why))


def permanent_fix(value: object) -> str | None:
    if holdings.thread_pool_in_use(value) is not None:
        return "create the pool lazily in __getitem__ or in worker_init_fn, not in __init__"
    if holdings.threading_kind(value) is not None:
        return ("create locks and threads lazily in __getitem__ or in worker_init_fn "
                "(or use multiprocessing's), not in __init__")
    if is_a(value, types.GeneratorType):
        return "keep no generator on the dataset: make it in __iter__ or __getitem__"
    if holdings.is_file_object(value) or type(value).__name__ == "Connection":
        return "open files and connections lazily in __getitem__ (or in worker_init_fn)"
    return None


# -- after a failure: the rungs per kind ------------------------------------------

# Fewer workers is no rung: each worker is seeded base_seed + worker_id and
# batches go to workers round robin, so the batches would change. Emulated
# workers are exact and need no process, shared memory or descriptor.
LADDERS: dict[str, tuple[Rung, ...]] = {
    DIED: (Rung.RESTART, Rung.EMULATED),
    HUNG: (Rung.RESTART, Rung.EMULATED),
    SHM: (Rung.FEWER, Rung.EMULATED),
    FDS: (Rung.FILE_SYSTEM, Rung.EMULATED),
    # Memory pressure from workers x prefetch: once, with fewer batches in
    # flight; raised again, it is the program's own (torch's error).
    MEMORY: (Rung.FEWER,),
    # A repair that a worker could not apply fails the same way in new workers.
    REMEDY: (Rung.EMULATED,),
    # A forked worker touched CUDA: new processes that inherit no CUDA state
    # (the loader planned again for spawn, with its repairs, where all of it
    # pickles: ``away_from_fork``), else emulated workers, in this process,
    # where CUDA works.
    CUDA: (Rung.SPAWN_WORKERS, Rung.EMULATED),
}
ONCE = (MEMORY,)  # kinds recovered at most once per rung
# The settings a real-worker rung adds; they stay for the later rungs.
SETTINGS = {Rung.FEWER: "prefetch_factor=1", Rung.FILE_SYSTEM: "file_system sharing"}
MAX_FAILURES = 2  # a rung that failed twice is not tried again


def next_rung(kind: str, failures: Mapping[Rung, int]) -> Rung | None:
    """The first rung for ``kind`` that has not failed ``MAX_FAILURES`` times
    (a failure of the workers as asked counts as one of RESTART), or None."""
    limit = 1 if kind in ONCE else MAX_FAILURES
    for rung in LADDERS[kind]:
        if failures.get(rung, 0) < limit:
            return rung
    return None
