"""A DataLoader's checks, from its arguments to what the loader keeps.

The patch calls ``decide_construction`` in ``DataLoader.__init__`` and
``decide_iteration`` in ``_get_iterator``; the recovery calls
``plan_without_fork`` once forked workers failed. Nothing here names a rule:
a finding is asked what it decided (its ``rung``, what it ``kept``). Its
``changes`` become the call's arguments (at iteration, the loader's
attributes); what it keeps goes in the loader's ``LoaderState``, where the
worker checks' records wait (``pending``) until the recovery saw their
remedies hold in the workers.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Hashable, Iterable
from typing import TYPE_CHECKING, Any

from .. import callsite, facts
from ..config import CONFIG
from ..inspection import holdings
from ..inspection.mainmodule import importable_by_reference, main_is_guarded
from ..inspection.parts import parts_of
from ..loaderstate import Kept, state_of
from ..rules import InitContext, IterContext
from ..rung import Rung
from . import run_checks, settle, settle_later

if TYPE_CHECKING:
    from types import FrameType

    from ..inspection.failures import Failure
    from ..report import Intervention
    from ..rules import Finding

# A DataLoader (torch's, or a subclass): its attributes are read by name.
Loader = Any

# What the worker checks read off a loader, and may change on it.
ITER_ARGS = ("num_workers", "multiprocessing_context", "dataset", "collate_fn",
             "worker_init_fn", "timeout")


def keep_state(loader: Loader, findings: Iterable[Finding]) -> None:
    state = state_of(loader)
    for finding in findings:
        state.keep(finding.kept)


# -- construction ----------------------------------------------------------------

def decide_construction(values: dict[str, Any], defaults: dict[str, Any],
                        instance: Loader) -> tuple[dict[str, Any], list[Finding]] | None:
    """The checks at ``dataloader.init`` for the bound ``values`` (defaults
    filled in): ``(the arguments they changed, findings applied)``, or None:
    unchanged. ``keep_state`` keeps their state on ``instance``."""
    workers = values.get("num_workers")
    if not isinstance(workers, int) or workers < 0:
        return None  # torch rejects it, in its own words: nothing of ours applies
    ctx = InitContext(facts.current(values.get("multiprocessing_context")), defaults=defaults)
    found, work = run_checks("dataloader.init", values, ctx)
    # Always: the site is the loader's origin, which loaders built from it inherit.
    site = callsite.loader_site(instance, values.get("dataset"))
    if not found or not settle(found, site, work):
        return None
    return {name: value for name, value in work.items() if value is not values[name]}, found


# -- iteration --------------------------------------------------------------------

def _plan_key(loader: Loader) -> Hashable:
    return (tuple(id(getattr(loader, name)) for name in ITER_ARGS),
            facts.effective_start_method(loader.multiprocessing_context),
            facts.opencl_runtime_loaded())  # CV402: a first OpenCL use between epochs


def decide_iteration(loader: Loader, frame: FrameType) -> None:
    """Run the worker checks for ``loader`` once per state of what they read;
    their records wait on the loader (``LoaderState.pending``)."""
    state = state_of(loader)
    key = _plan_key(loader)
    if state.plan_key == key:
        # The carried process state's record waits on the workers of each iterator
        # again, until a start's carried something (main() changes it between epochs).
        carry = state.kept.process_state
        record = getattr(carry, "record", None)
        if record is not None and not carry.said and record not in state.pending:
            state.pending.append(record)
        return
    if loader.num_workers:
        values, found, work, ctx = _plan_workers(loader, frame)
        if found:
            state.pending = _apply(loader, values, found, work)
        # A loader nothing of ours touches (its process state carried beside it
        # at most): the plan's pickle of its dataset goes as it is to each worker.
        state.untouched = all(_beside(f) for f in found)
        if state.untouched and CONFIG.mode == "fix":
            for plan in ctx.plans.get("pickling_plans", {}).values():
                if plan.pickled is not None:
                    from ..remedies import sent_once  # noqa: PLC0415 - 0.6 ms at `import torch`, where this module loads (-X importtime: remedies.sent_once, inspection.probe, inventory)

                    sent_once.keep(loader, loader.dataset, plan.pickled)
    state.plan_key = _plan_key(loader)


def _beside(finding: Finding) -> bool:
    """Whether ``finding`` only sends the process state beside what the workers
    are sent (DL220)."""
    kept = finding.kept
    return not (finding.changes or finding.remedies or finding.rung or finding.applied_by) \
        and bool(kept) and kept == Kept(process_state=kept.process_state)


def _plan_workers(loader: Loader, frame: FrameType, fork_failed: Failure | None = None
                  ) -> tuple[dict[str, Any], list[Finding], dict[str, Any], IterContext]:
    """The worker checks' findings for ``loader`` and the arguments they leave,
    nothing applied. ``fork_failed``: its forked workers' failure, which rules
    fork out (``IterContext.fork_failed``)."""
    values = {name: getattr(loader, name) for name in ITER_ARGS}
    ctx = IterContext(facts.current(loader.multiprocessing_context),
                      main_guarded=functools.cache(lambda: main_is_guarded(frame)),
                      fork_failed=fork_failed)
    found, work = run_checks("dataloader.iter", values, ctx)
    return values, found, work, ctx


def _apply(loader: Loader, values: dict[str, Any], found: list[Finding], work: dict[str, Any],
           unsaid: Iterable[Finding] = ()) -> list[Intervention]:
    """Settle the worker checks' findings for ``loader`` (in fix mode: set the
    arguments they changed, keep their state): the records to make once the
    remedies held, but ``unsaid``'s (another says them)."""
    applied, made = settle_later(found, callsite.iteration_site(loader), work)
    if applied:
        for name in ITER_ARGS:
            if work[name] is not values[name]:
                setattr(loader, name, work[name])
        keep_state(loader, found)
    skipped = {f.rule.code for f in unsaid}
    for finding, record in zip(found, made):
        record.subject = id(loader)  # each loader its own record, at one site too
        carry = finding.kept.process_state
        if carry is not None:
            carry.record = record  # for the later iterators, until it is said
    return [record for record in made if record.code not in skipped]


def plan_without_fork(loader: Loader, failure: Failure,
                      frame: FrameType) -> list[Intervention] | None:
    """After ``failure`` of ``loader``'s forked workers (one touched CUDA): the
    worker checks again, fork ruled out, applied and kept where they move the
    workers to spawn (with its repairs and warm start). The records to make
    once the new workers delivered, or None (emulated workers: nothing applied)."""
    if CONFIG.mode != "fix":
        return None
    values, found, work, _ctx = _plan_workers(loader, frame, fork_failed=failure)
    moved = [f for f in found if f.rung is Rung.SPAWN]
    if not moved or any(f.rung is Rung.EMULATED for f in found):
        return None
    # The move is said by the recovery's record, once the new workers delivered.
    made = _apply(loader, values, found, work, unsaid=moved)
    state_of(loader).plan_key = _plan_key(loader)
    return made


def warm_start_ahead(loader: Loader, frame: FrameType) -> None:
    """At construction: where the worker checks will start this loader's
    workers warm (repaired for spawn), the warm server starts now, in the
    background, its imports overlapping the program's setup (recorded and
    applied at the first iterator). A loader that forks, or shows no sign of
    needing a repair, costs nothing here."""
    if not loader.num_workers or CONFIG.mode != "fix":
        return
    # Spawn, or fork where the ladder moves it away (macOS); cheap: no probe. Not
    # for CUDA initialised here: fork stays unless its workers touch it (DL205).
    method = facts.effective_start_method(loader.multiprocessing_context)
    if not (method == "spawn" or method == "fork" and facts.Facts().platform == "darwin"):
        return
    parts = parts_of(loader)
    if method == "spawn" and not _repair_likely(parts):
        return  # the common case: nothing read here that grows with the dataset
    _values, found, work, _ctx = _plan_workers(loader, frame)
    if any(f.rung is Rung.WARM_SPAWN for f in found):
        from ..remedies import warmstart  # noqa: PLC0415 - 0.6 ms at `import torch`, where this module loads (-X importtime: remedies.warmstart, diagnostics, faulthandler)

        warmstart.start_ahead(warmstart.libraries_for(list(parts_of(work).values())),
                              work["multiprocessing_context"])


def _repair_likely(parts: dict[str, Any]) -> bool:
    """Signs, from the process and the parts' types (never walking what the
    dataset holds), that spawn workers will need a repair."""
    from ..inspection import threads  # noqa: PLC0415 - 0.1 ms at `import torch`, where this module loads (-X importtime: inspection.threads)
    from ..inspection.descriptors import shared_at_fork  # noqa: PLC0415 - 0.2 ms at `import torch`, where this module loads (-X importtime: inspection.descriptors)

    if shared_at_fork() or threads.others_alive():
        return True
    for part in parts.values():
        if part is None:
            continue
        code = part if isinstance(part, (type, types.FunctionType)) else type(part)
        if not importable_by_reference(code) or holdings.forwards_attributes(part):
            return True
    return False
