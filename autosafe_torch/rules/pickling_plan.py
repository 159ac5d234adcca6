"""The one pickling planner: what it takes for the loader's parts to reach
spawn/forkserver workers (``PicklingPlan``).

The rules of ``pickling.py`` (DL201-DL203, DL208) and ``memmap.py`` (DL218)
read the same plan, cached per check context; the ladder reads its
failures. Planning installs nothing: the probe tries the planned reducers
without registering them.
"""

from __future__ import annotations

from typing import Any

from ..inspection import holdings, objwalk
from ..inspection.objwalk import is_a
from ..inspection.parts import PARTS, held_in_parts
from ..config import CONFIG
from . import RULES, IterContext
from .fork_plan import fork_is_safe, per_parts, spawning_workers
from .repairs import REPAIRS, Meeting, offer

class PicklingPlan:
    """The repairs that make a loader's parts reach spawn/forkserver workers:
    one field per repair of the registry (``repairs.REPAIRS``: what each
    holds, and which rule says it), and ``refused``: why a dataset could not
    be built again; ``failures``: what still does not pickle with all of
    them (ProbeResults); ``loggers``: the configured loggers the parts hold
    (DL219); ``pickled``: the dataset's pickle, where nothing needs a repair;
    ``met``: the kinds of object the last probes met (inventory.classify)."""

    __slots__ = tuple(r.field for r in REPAIRS) + ("refused", "failures", "loggers", "pickled",
                                                   "met")
    # What the planner reads and sets itself of the fields (REPAIRS makes each):
    nested: tuple[str, str] | None  # (path, why)
    pools: list[str]  # paths
    images: list[tuple[str, str, Any]]  # (path, error, image)
    rebuilt: list[tuple[str, Any, str]]  # (path, dataset, why)
    forwarders: dict[type, str]  # {class: path}
    met: frozenset[str]

    def __init__(self):
        for repair in REPAIRS:
            setattr(self, repair.field, repair.empty())
        self.refused, self.failures, self.loggers, self.pickled = [], [], [], None
        self.met = frozenset()

    @property
    def needs_repair(self):
        return any(getattr(self, r.field) for r in REPAIRS)


MAX_REPAIRS = 16  # one failure is found per probe; a dataset has few kinds


def pickling_plan(args, ctx: IterContext):
    """The ``PicklingPlan`` for ``args``, cached on ``ctx`` (planning installs
    nothing: the probe tries the planned reducers without registering them)."""
    return per_parts(ctx, "pickling_plans", args,
                      lambda: plan_pickling({name: args[name] for name in PARTS},
                                             lambda: not fork_is_safe(args, ctx),
                                             repairing=lambda: _warm_ahead(args, ctx)))


def _warm_ahead(args, ctx: IterContext):
    """The parts need a repair to reach spawn workers, which then come from
    the warm server (DL209): in fix mode it starts now, in the background, so
    that its imports overlap the rest of the planning (a loader whose repair
    is refused leaves an idle server, ended at exit)."""
    from ..remedies import warmstart  # noqa: PLC0415 - DL209's warm start only, when a loader needs it

    warm = RULES.get("DL209")
    if CONFIG.mode != "fix" or warm is None or not CONFIG.rule_enabled(warm.code, warm.group) \
            or not spawning_workers(args, ctx) \
            or not warmstart.fork_server_available(ctx.facts.platform):
        return
    warmstart.start_ahead(warmstart.libraries_for([args[name] for name in PARTS]))



def plan_pickling(parts, may_rebuild=lambda: False, rebuilt=(), repairing=lambda: None):
    """The plan for ``parts``. ``may_rebuild()``: whether datasets may be
    built again in each worker (no fork rung is safe); ``rebuilt``: those
    approved so far, planned first (planning starts again after each one, so
    that nothing inside them is planned for); ``repairing()``: called once a
    probe failed, before the repairs are looked for."""
    from ..inspection import holdings, probe  # noqa: PLC0415 - when a loader needs it, not at torch's import
    from ..remedies import images, pickling, pools, rebuild  # noqa: PLC0415 - when a loader needs it, not at torch's import

    given, parts = parts, dict(parts)  # by-value repairs replace parts in this copy
    plan, planned, owners = PicklingPlan(), {}, None
    plan.rebuilt = list(rebuilt)
    if plan.rebuilt:
        planned.update(rebuild.planned_reducers([obj for _path, obj, _why in plan.rebuilt]))
    looked = set()  # kinds whose holders were looked for (what the probes met calls for)
    for _ in range(MAX_REPAIRS):
        dataset = parts["dataset"]
        results = [probe.probe(part, name, planned, plan.nested is not None,
                               keep=name == "dataset", watch=dataset)
                   for name, part in parts.items() if part is not None]
        met = plan.met = frozenset().union(*(r.kinds for r in results))
        # Thread pools (remade in each worker) and attribute forwarders (rebuilt from
        # their attributes: their unpickling recurses, their pickling does not fail)
        # are looked for where the probes met one: what a dataset built again in each
        # worker holds is made by its constructor there.
        if "pool" in met and "pool" not in looked and dataset is not None:
            looked.add("pool")
            plan.pools = [here for here, _p, _e in holdings.find_thread_pools(dataset)
                          if not _inside(here, plan.rebuilt)]
            if plan.pools:
                planned.update(pools.pool_reducers())
                continue
        if "forwarder" in met and "forwarder" not in looked:
            looked.add("forwarder")
            plan.forwarders = {cls: here for cls, here in attribute_forwarders(parts).items()
                               if not _inside(here, plan.rebuilt)}
            if plan.forwarders:
                planned.update(pickling.forwarder_reducers(plan.forwarders))
                continue
        failures = [r for r in results if not r.ok]
        if not failures:
            failures = (_unfaithful(parts, planned, plan, met)
                        or _uncarried_loggers(results, plan))
            if not failures:
                if not plan.needs_repair and not plan.loggers \
                        and not any(r.meets for r in results if r.path != "dataset"):
                    plan.pickled = next((r.pickled for r in results if r.path == "dataset"),
                                        None)
                return plan
            if not plan.images and all(images.reopens(f.value) for f in failures):
                plan.images = [(f.path, f.error, f.value) for f in failures]
                planned.update(images.image_reducers())
                continue
        repairing()
        failure = failures[0]
        value, top = failure.value, failure.path.split(".")[0].split("[")[0]
        if owners is None:
            owners = objwalk.Owners(parts)
        meeting = Meeting(failure, value, value if is_a(value, type) else type(value), top,
                          "%s: %s" % (failure.path, failure.error), parts, plan,
                          lambda owners=owners: owners)  # type: ignore[misc]  # a default mypy cannot type in a lambda
        if offer(plan, meeting, planned):
            continue
        if may_rebuild() and len(plan.rebuilt) < MAX_REPAIRS:
            here, dataset, refusal = rebuild.rebuildable_owner(owners, value)
            if dataset is None:
                plan.refused += [refusal] if refusal else []
                plan.failures = failures
                return plan
            return plan_pickling(given, may_rebuild,
                                 plan.rebuilt + [(here, dataset, meeting.why)], repairing)
        plan.failures = failures
        return plan
    plan.failures = failures
    return plan


def _unfaithful(parts, planned, plan, met):
    """What pickles but drops an open file its methods use (a PIL multi-page
    image: ``inspection/dropped.py``), outside the datasets built again in
    each worker (their constructor makes what they hold there). Looked for
    where something could drop one: the probes met an image, or the kernel
    shows a file open for reading (a pickle that drops one never meets it)."""
    from ..inspection import dropped  # noqa: PLC0415 - when a loader needs it, not at torch's import
    from ..inspection.descriptors import shared_at_fork  # noqa: PLC0415 - when a loader needs it, not at torch's import

    if "image" not in met and not shared_at_fork():
        return []
    return [f for f in dropped.unfaithful(parts, planned) if not _inside(f.path, plan.rebuilt)]


def _uncarried_loggers(results, plan):
    """The loggers the parts hold whose configuration a spawned worker would
    lack (``plan.loggers``, carried by DL219); as failures, those it cannot
    be carried for (a handler no worker can make again)."""
    from ..inspection.probe import ProbeResult  # noqa: PLC0415 - when a loader needs it, not at torch's import
    from ..remedies import loggers  # noqa: PLC0415 - when a loader needs it, not at torch's import

    held = {id(lg): lg for r in results for lg in r.loggers}.values()
    plan.loggers = [lg for lg in held if loggers.configured(lg)]
    failures = []
    for logger in plan.loggers:
        why = loggers.uncarried(logger)
        if why is not None:
            failures.append(ProbeResult(
                False, "the logger %r" % logger.name, "%s, and without it the lines logged "
                "in a worker are lost" % why, logger))
    return failures


def _inside(path, rebuilt):
    """Whether ``path`` lies in one of the datasets ``rebuilt`` (``(path, dataset, why)``)."""
    return any(path == where or path.startswith((where + ".", where + "["))
               for where, _dataset, _why in rebuilt)


def attribute_forwarders(parts):
    """``{class: path}``: classes of the parts' objects that forward unknown
    attributes (``holdings.forwards_attributes``), each at its first instance."""
    found: dict[type, str] = {}
    for here, obj in held_in_parts(parts, holdings.forwards_attributes):
        found.setdefault(type(obj), here)
    return found
