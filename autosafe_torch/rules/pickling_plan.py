"""The one pickling planner: what it takes for the loader's parts to reach
spawn/forkserver workers (``PicklingPlan``).

The rules of ``pickling.py`` (DL201-DL203, DL208) and ``memmap.py`` (DL218)
read the same plan, cached per check context; the ladder reads its
failures. Planning installs nothing: the probe tries the planned reducers
without registering them.
"""

import types

from ..inspection import holdings, objwalk
from ..inspection.naming import a_or_an
from ..inspection.objwalk import is_a
from ..inspection.parts import PARTS
from ..remedies import workerinit
from .fork_plan import fork_is_safe, per_parts

class PicklingPlan:
    """The repairs that make a loader's parts reach spawn/forkserver workers.

    ``by_value``: part name -> (the part sent by value, why) for a lambda or
    local function as collate_fn/worker_init_fn (DL202); ``nested``: (path,
    why) of the first function or class inside a part that a worker cannot
    import, when all such go by value (DL202); ``classes``: class ->
    (path, why) for classes of an interactive ``__main__`` (DL203); ``files``:
    (path, why, the file) of the first read-only file, when files travel by path (DL201);
    ``maps``: (path, why, the map) of the first ``mmap.mmap``, when maps of
    named files are mapped again in each worker (DL201);
    ``pools``: paths of thread pools, sent as new ones (DL208);
    ``locks``: (path, why, the user's locks as ``UsersLocks.named``) of the
    first lock nobody holds, when such locks are sent as new, unlocked ones
    (DL201);
    ``forwarders``: class -> path of the first instance of a class that
    forwards unknown attributes, whose unpickling would recurse, built from
    its attributes instead (DL201); ``handlers``: ``(path, handler)`` of
    logging handlers made again in each worker from their file or stream
    (DL201); ``images``: ``(path, why, image)`` of PIL images whose pickle
    would drop their open file, opened again at their frame in each worker
    (DL201); ``rebuilt``: ``(path, dataset, why)`` of datasets built again in
    each worker from their constructor's arguments, where no fork rung is
    safe (DL201, ``remedies/rebuild.py``), and ``refused``: why a dataset
    could not be; ``failures``: what still does not pickle with all of
    these (ProbeResults).
    """

    __slots__ = ("by_value", "nested", "classes", "files", "maps", "pools", "forwarders",
                 "locks", "handlers", "images", "rebuilt", "refused", "failures", "loggers",
                 "pickled", "met")

    def __init__(self):
        self.by_value, self.classes, self.failures, self.pools = {}, {}, [], []
        self.forwarders, self.handlers, self.rebuilt, self.refused = {}, [], [], []
        self.images, self.loggers = [], []
        self.nested = self.files = self.maps = self.locks = self.pickled = None
        self.met = frozenset()  # the kinds of object the last probes met (inventory.classify)

    @property
    def needs_repair(self):
        return bool(self.by_value or self.nested or self.classes or self.files or self.maps
                    or self.pools or self.forwarders or self.locks or self.handlers
                    or self.images or self.rebuilt)



MAX_REPAIRS = 16  # one failure is found per probe; a dataset has few kinds


def pickling_plan(args, ctx):
    """The ``PicklingPlan`` for ``args``, cached on ``ctx`` (planning installs
    nothing: the probe tries the planned reducers without registering them)."""
    return per_parts(ctx, "pickling_plans", args,
                      lambda: plan_pickling({name: args[name] for name in PARTS},
                                             lambda: not fork_is_safe(args, ctx)))



def plan_pickling(parts, may_rebuild=lambda: False, rebuilt=()):
    """The plan for ``parts``. ``may_rebuild()``: whether datasets may be
    built again in each worker (no fork rung is safe); ``rebuilt``: those
    approved so far, planned first (planning starts again after each one, so
    that nothing inside them is planned for)."""
    from ..inspection import probe  # noqa: PLC0415 - when a loader needs it, not at torch's import
    from ..inspection.mainmodule import interactive_main  # noqa: PLC0415 - when a loader needs it, not at torch's import
    from ..remedies import (byvalue, handlers, images, locks, memmaps, pickling, pools,  # noqa: PLC0415 - when a loader needs it, not at torch's import
                            rebuild, reopen)

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
        failure = failures[0]
        value, top = failure.value, failure.path.split(".")[0].split("[")[0]
        new = _by_value(parts.get(top), value) if top in ("collate_fn", "worker_init_fn") \
            else None
        cls = value if is_a(value, type) else type(value)
        why = "%s: %s" % (failure.path, failure.error)
        if owners is None:
            owners = objwalk.Owners(parts)
        handler = handlers.holding(owners, value)
        if new is not None:
            plan.by_value[top] = (new, why)
            parts[top] = new
        elif handler is not None and handler[1] not in [h for _p, h in plan.handlers]:
            plan.handlers.append(handler)
            planned.update(handlers.handler_reducers({type(handler[1])}))
        elif holdings.file_kind(value) == holdings.READONLY and plan.files is None:
            plan.files = (failure.path, failure.error, value)
            planned.update(reopen.file_reducers())
        elif plan.maps is None and memmaps.travels(value):
            plan.maps = (failure.path, failure.error, value)
            planned.update(memmaps.map_reducers())
        elif plan.locks is None and locks.unheld_lock(value) \
                and (users := locks.UsersLocks(parts)).holds(value):
            plan.locks = (failure.path, failure.error, users.named)
            planned.update(locks.lock_reducers())
        elif cls.__module__ == "__main__" and interactive_main() and cls not in plan.classes:
            plan.classes[cls] = (failure.path, failure.error)
            planned.update(byvalue.class_reducers((cls,)))
        elif plan.nested is None and _not_importable(value):
            plan.nested = (failure.path, why)
        elif may_rebuild() and len(plan.rebuilt) < MAX_REPAIRS:
            here, dataset, refusal = rebuild.rebuildable_owner(owners, value)
            if dataset is None:
                plan.refused += [refusal] if refusal else []
                plan.failures = failures
                return plan
            return plan_pickling(given, may_rebuild, plan.rebuilt + [(here, dataset, why)])
        else:
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
        handler = loggers.uncarried(logger)
        if handler is not None:
            failures.append(ProbeResult(
                False, "the logger %r" % logger.name, "its handler (%s) cannot be made again "
                "in a worker, and without it the lines logged there are lost" % (
                    a_or_an(type(handler).__name__)), logger))
    return failures


def _inside(path, rebuilt):
    """Whether ``path`` lies in one of the datasets ``rebuilt`` (``(path, dataset, why)``)."""
    return any(path == where or path.startswith((where + ".", where + "["))
               for where, _dataset, _why in rebuilt)


def attribute_forwarders(parts):
    """``{class: path}``: classes of the parts' objects that forward unknown
    attributes (``holdings.forwards_attributes``), each at its first instance."""
    found = {}
    for here, obj in held_in_parts(parts, holdings.forwards_attributes):
        found.setdefault(type(obj), here)
    return found


def _not_importable(value):
    """A function or class a worker cannot import (a lambda, a local function or
    class), or an instance of such a class: cloudpickle can send it by value."""
    from ..inspection.mainmodule import importable_by_reference  # noqa: PLC0415 - when a loader needs it, not at torch's import

    if is_a(value, (types.FunctionType, type)):
        return not importable_by_reference(value)
    cls = type(value)
    return "<locals>" in cls.__qualname__ or (
        cls.__module__ == "__main__" and not importable_by_reference(cls))


def _by_value(part, failing):
    """``part`` (a collate_fn or worker_init_fn) with ``failing``, the function
    that does not pickle, sent by value; None when ``failing`` is not that
    function nor the user's own inside a worker_init_fn of ours."""
    from ..remedies import byvalue  # noqa: PLC0415 - only for a function sent by value

    if failing is part and callable(part):
        return byvalue.by_value(part)
    if failing is workerinit.user_function(part) and callable(failing):
        return workerinit.with_user_function(part, byvalue.by_value(failing))
    return None



def held_in_parts(parts, wanted):
    """``(path, obj)`` for each object the loader's parts (``dataset``,
    ``collate_fn``, ``worker_init_fn``: a mapping) hold for which ``wanted(obj)``,
    once each, as the walk finds them."""
    seen = set()
    for name in PARTS:
        if parts[name] is None:
            continue
        for here, obj, _edge in objwalk.walk(parts[name], name, stop=holdings.stop_at):
            if id(obj) not in seen and wanted(obj):
                seen.add(id(obj))
                yield here, obj


