"""The one pickling planner: what it takes for the loader's parts to reach
spawn/forkserver workers (``PicklingPlan``), read by the rules of
``pickling.py`` and ``memmap.py`` and by the ladder. Planning installs
nothing: the probe tries the planned reducers without registering them.
"""

from __future__ import annotations

from typing import Any

from ..config import CONFIG
from ..inspection import objwalk
from ..inspection.objwalk import is_a
from ..inspection.parts import parts_of
from . import RULES, IterContext
from .fork_plan import fork_is_safe, per_parts, spawning_workers
from .repairs import MAX_REPAIRS, REPAIRS, Look, Meeting, hold, look, offer


class PicklingPlan:
    """One field per repair of ``repairs.REPAIRS`` (those the rules read typed);
    ``refused``: why a dataset could not be built again; ``failures``: the
    ProbeResults still failing; ``pickled``: the dataset's pickle, where nothing
    needs a repair; ``met``: the kinds the last probes met (inventory.classify)."""

    nested: tuple[str, str] | None  # (path, why)
    pools: list[str]  # paths
    images: list[tuple[str, str, Any]]  # (path, error, image)
    rebuilt: list[tuple[str, Any, str]]  # (path, dataset, why)
    loggers: list[Any]  # the configured loggers the parts hold (DL219)
    met: frozenset[str]

    def __init__(self):
        for repair in REPAIRS:
            setattr(self, repair.field, repair.empty())
        self.refused, self.failures, self.pickled, self.met = [], [], None, frozenset()

    @property
    def needs_repair(self):
        return any(getattr(self, r.field) for r in REPAIRS if not r.carried)


def pickling_plan(args, ctx: IterContext):
    return per_parts(ctx, "pickling_plans", args,
                      lambda: plan_pickling(parts_of(args), lambda: not fork_is_safe(args, ctx),
                                             repairing=lambda: _warm_ahead(args, ctx)))


def _warm_ahead(args, ctx: IterContext):
    """The parts need a repair, so spawn workers will come from the warm server
    (DL209): in fix mode it starts now, its imports overlapping the planning
    (a refused repair leaves an idle server, ended at exit)."""
    from ..facts import fork_server_available  # noqa: PLC0415 - 0.2 ms at `import cv2` before torch, where the rules load (-X importtime: facts)

    warm = RULES.get("DL209")
    if CONFIG.mode != "fix" or warm is None or not CONFIG.rule_enabled(warm.code, warm.group) \
            or not spawning_workers(args, ctx) or not fork_server_available(ctx.facts.platform):
        return
    from ..remedies import warmstart  # noqa: PLC0415 - 0.6/1.5 ms at `import torch` / `import cv2`, where the rules load (-X importtime: remedies.warmstart, diagnostics, faulthandler; at cv2's also multiprocessing.connection, resource_sharer, spawn)

    warmstart.start_ahead(warmstart.libraries_for(list(parts_of(args).values())))


def plan_pickling(parts, may_rebuild=lambda: False, repairing=lambda: None, kept=None):
    """``may_rebuild()``: whether the repairs that run the user's code may be
    planned (no fork rung is safe); planning starts again after each, with their
    entries ``kept``, so nothing inside them is planned for. ``repairing()``:
    called once a probe failed."""
    from ..inspection import probe  # noqa: PLC0415 - 0.6 ms at `import torch` and at `import cv2`, where the rules load (-X importtime: inspection.probe, inventory)

    given, parts = parts, dict(parts)  # by-value repairs replace parts in this copy
    plan, owners = PicklingPlan(), None
    planned: dict[type, Any] = {}
    looked: set[str | None] = set()  # the kinds met whose holders were looked for
    for repair in [r for r in REPAIRS if r.runs_user_code and kept is not None]:
        hold(plan, planned, repair, getattr(kept, repair.field))
    for _ in range(MAX_REPAIRS):
        results = [probe.probe(part, name, planned, plan.nested is not None,
                               keep=name == "dataset", watch=parts["dataset"])
                   for name, part in parts.items() if part is not None]
        plan.met = frozenset().union(*(r.kinds for r in results))
        failures, again = look(Look(parts, plan, planned, results),
                               [r for r in results if not r.ok], looked)
        if again:
            continue
        if not failures:
            if not any(getattr(plan, r.field) for r in REPAIRS) \
                    and not any(r.meets for r in results if r.path != "dataset"):
                plan.pickled = next((r.pickled for r in results if r.path == "dataset"), None)
            return plan
        repairing()
        failure = failures[0]
        value, top = failure.value, failure.path.split(".")[0].split("[")[0]
        if owners is None:
            owners = objwalk.Owners(parts)
        meeting = Meeting(failure, value, value if is_a(value, type) else type(value), top,
                          "%s: %s" % (failure.path, failure.error), parts, plan, owners)
        taken = offer(plan, meeting, planned, may_rebuild)
        if taken is None:
            break
        if taken.runs_user_code:
            return plan_pickling(given, may_rebuild, repairing, plan)
    plan.failures = failures
    return plan
