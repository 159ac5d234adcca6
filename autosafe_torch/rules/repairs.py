"""The registry of repairs: what makes a loader's parts reach spawn/forkserver
workers, one entry per kind of holder.

Each ``Repair`` declares, in one place:

- the ``PicklingPlan`` field it fills (``field``) and the rule whose record
  says it (``code``: DL202, DL203 and DL208 have rules of their own; every
  other repair is said by DL201's one record);
- what it finds where the probe failed (``meets``: the object that did not
  pickle, in its place; None where another look finds it: pools and
  forwarders from what the probes met, images from what a pickle drops, a
  rebuilt dataset from the constructor recorded for it), and how that is
  added to the plan (``add``);
- the reducers the probe tries while planning, and the remedy that installs
  them in fix mode (``remedy``), or a worker step of its own;
- the words of its record (``said``: what it found, why, what was done)
  and its permanent fix (``fix``, the first present by ``fix_rank`` wins);
- whether it runs the user's code in a worker (``runs_user_code``: the
  rebuild calls the dataset's constructor there, never in the training
  process).

The planner (``pickling_plan.plan_pickling``) tries them in ``plan_rank``
order for each failure; DL201 (``pickling.unpicklable_dataset``) says them
in the order of ``REPAIRS``.
"""

from __future__ import annotations

import importlib
import types
from typing import Any, Callable, NamedTuple

from ..inspection.naming import a_or_an
from ..inspection.objwalk import is_a
from . import number_of, what_is


class Meeting(NamedTuple):
    """What a repair is shown where the probe failed: the failure, the object
    that did not pickle and its class, the part it lies in (``top``), the
    parts as planned so far, the plan, and the objects' owners (lazily)."""

    failure: Any
    value: Any
    cls: type
    top: str
    why: str
    parts: dict[str, Any]
    plan: Any
    owners: Callable[[], Any]


class Said(NamedTuple):
    """A repair's part of DL201's record."""

    before: dict[str, Any]  # what it acts on, by name
    whys: list[str]
    done: list[str]
    repairs: list[str]  # the words of the strategy
    remedy: Callable[[Any], Any]


class Repair(NamedTuple):
    field: str
    code: str
    empty: Callable[[], Any]  # the field's value in a new plan
    meets: Callable[[Meeting], Any] | None = None  # its plan entry for this failure, or None
    add: Callable[[Any, Any, Meeting], None] | None = None  # the entry into the plan
    reducers: Callable[[Any], dict[type, Any]] | None = None  # planned for the probe
    said: Callable[[Any, dict[str, Any]], Said] | None = None  # DL201's words
    fix: str | Callable[[], str] | None = None  # a callable: read where it is said
    fix_rank: int = 99
    plan_rank: int = 99
    runs_user_code: bool = False


REBUILD_FIX = ("keep paths on the dataset and open files, readers and handlers lazily in "
               "__getitem__ (or in worker_init_fn), not in __init__")
LOCK_FIX = ("create locks lazily in __getitem__ or in worker_init_fn (or use "
            "multiprocessing's), not in __init__")
FORWARDER_FIX = ("let __getattr__ raise AttributeError for the names it does not forward: "
                 "unpickling asks the new, empty instance for __setstate__")


def _named(items, most=3):
    """``dataset.a (an open file), dataset.b (an h5py Dataset) and 2 more``."""
    shown = ["%s (%s)" % (path, what_is(obj)) for path, obj in items[:most]]
    more = len(items) - most
    return ", ".join(shown) + (" and %d more" % more if more > 0 else "")


# -- DL202: functions a worker cannot import, sent by value -------------------------

def _by_value_meets(m: Meeting):
    if m.top not in ("collate_fn", "worker_init_fn"):
        return None
    new = by_value_part(m.parts.get(m.top), m.value)
    return None if new is None else (m.top, new, m.why)


def _by_value_add(plan, entry, m: Meeting):
    top, new, why = entry
    plan.by_value[top] = (new, why)
    m.parts[top] = new


def _nested_meets(m: Meeting):
    return (m.failure.path, m.why) if m.plan.nested is None and not_importable(m.value) \
        else None


# -- DL203: classes of an interactive __main__ ---------------------------------------

def _class_meets(m: Meeting):
    from ..inspection.mainmodule import interactive_main

    if m.cls.__module__ == "__main__" and interactive_main() and m.cls not in m.plan.classes:
        return m.cls, (m.failure.path, m.failure.error)
    return None


def _class_add(plan, entry, _m):
    cls, where = entry
    plan.classes[cls] = where


def _class_reducers(entry):
    from ..remedies import byvalue

    return byvalue.class_reducers((entry[0],))


# -- DL201: each holder, made again in each worker ------------------------------------

def _handler_meets(m: Meeting):
    from ..remedies import handlers

    handler = handlers.holding(m.owners(), m.value)
    if handler is not None and handler[1] not in [h for _p, h in m.plan.handlers]:
        return handler
    return None


def _handler_reducers(entry):
    from ..remedies import handlers

    return handlers.handler_reducers({type(entry[1])})


def _handlers_said(found, _args):
    from ..remedies import handlers, pickling

    classes = {type(h) for _where, h in found}
    return Said({"handlers": [where for where, _h in found]},
                ["a logging handler's lock and stream do not pickle"],
                ["%s made again from its file or stream" % _named(found)],
                ["make logging handlers again"],
                lambda args: pickling.install(handlers.handler_reducers(classes)))


def _first_met(field, holds):
    """``meets`` for a repair that plans from the first such holder only (its
    reducers send every one): ``(path, why, holder)``."""
    def meets(m: Meeting):
        if getattr(m.plan, field) is None and holds(m.value):
            return (m.failure.path, m.failure.error, m.value)
        return None
    return meets


def _remedy(module, name):
    """``remedies.<module>.<name>()``, the module imported when a loader needs it."""
    def call(_entry=None):
        return getattr(importlib.import_module("autosafe_torch.remedies." + module), name)()
    return call


def _read_only(value):
    from ..inspection import holdings

    return holdings.file_kind(value) == holdings.READONLY


def _travels(value):
    from ..remedies import memmaps

    return memmaps.travels(value)


def _files_said(found, args):
    from ..remedies import reopen

    path, why, held = found
    files = read_only_files(args) or [(path, held)]
    return Said({"files": [where for where, _f in files]},
                [why] + ["%s %s" % (where, note) for where, f in files
                         for note in [reopen.read_only_note(f)] if note],
                ["%s reopened by path" % _named(files)],
                ["reopen read-only files by path"],
                lambda args: reopen.install_reducers())


def _maps_said(found, args):
    from ..remedies import memmaps, pickling

    path, why, held = found
    maps = memory_maps(args) or [(path, held)]
    named = [(where, m) for where, m in maps if not memmaps.anonymous(m)]
    shared = [(where, m) for where, m in maps if memmaps.anonymous(m)]
    done, repairs = [], []
    if named:
        done.append("%s mapped again from %s" % (
            _named(named), "its file" if len(named) == 1 else "their files"))
        repairs.append("map memory maps again by path")
    if shared:
        done.append("%s (anonymous) shared through one block of shared memory" % _named(shared))
        repairs.append("share anonymous maps")
    return Said({"maps": [where for where, _m in maps]}, [why], done, repairs,
                lambda args: pickling.install(memmaps.map_reducers()))


def _lock_meets(m: Meeting):
    from ..remedies import locks

    if m.plan.locks is None and locks.unheld_lock(m.value):
        users = locks.UsersLocks(m.parts)
        if users.holds(m.value):
            return (m.failure.path, m.failure.error, users.named)
    return None


def _locks_said(found, _args):
    from ..remedies import locks, pickling

    path, why, named = found
    return Said({"locks": [where for where, _lock in named] or [path]}, [why],
                ["%s made anew, unlocked," % (_named(named) if named else path)],
                ["new unlocked locks"],
                lambda args: pickling.install(locks.lock_reducers()))


def _images_said(found, _args):
    from ..remedies import images

    return Said({"images": [where for where, _why, _img in found]},
                [why for _where, why, _img in found],
                ["%s opened again at its frame" % _named(
                    [(where, img) for where, _why, img in found])],
                ["open images again"], lambda args: images.install_reducers())


def _image_fix():
    from ..inspection.dropped import IMAGE_FIX  # imported with the first image met

    return IMAGE_FIX


def _rebuilt_said(found, _args):
    from ..remedies import rebuild

    datasets = [d for _where, d, _why in found]
    return Said({"rebuilt": [where for where, _d, _why in found]},
                [why for _where, _d, why in found],
                ["%s built again by its constructor's call, checked against this one there,"
                 % _named([(where, d) for where, d, _why in found])],
                ["build the dataset again"], lambda args: rebuild.install(datasets))


def _forwarders_said(found, _args):
    from ..remedies import pickling

    classes = list(found)
    return Said({"forwarders": list(found.values())},
                ["a worker's unpickling of %s recurses in its __getattr__ (it asks the empty "
                 "instance for __setstate__)" % ", ".join(found.values())],
                ["%s rebuilt from its attributes" % ", ".join(
                    "%s (%s)" % (where, a_or_an(cls.__name__)) for cls, where in found.items())],
                ["rebuild attribute forwarders"],
                lambda args: pickling.install(pickling.forwarder_reducers(classes)))


# The repairs, in the order DL201 says them; ``plan_rank``: the order in which
# the planner offers a failure to them (the first that meets it takes it).
REPAIRS: tuple[Repair, ...] = (
    Repair("by_value", "DL202", dict, meets=_by_value_meets, add=_by_value_add, plan_rank=0),
    Repair("nested", "DL202", lambda: None, meets=_nested_meets, plan_rank=6),
    Repair("classes", "DL203", dict, meets=_class_meets, add=_class_add,
           reducers=_class_reducers, plan_rank=5),
    Repair("pools", "DL208", list),  # found where the probes met a pool (the planner)
    Repair("files", "DL201", lambda: None, meets=_first_met("files", _read_only),
           reducers=_remedy("reopen", "file_reducers"), said=_files_said, fix=None,
           fix_rank=0, plan_rank=2),
    Repair("maps", "DL201", lambda: None, meets=_first_met("maps", _travels),
           reducers=_remedy("memmaps", "map_reducers"), said=_maps_said, fix=None, fix_rank=0,
           plan_rank=3),
    Repair("handlers", "DL201", list, meets=_handler_meets,
           reducers=_handler_reducers, said=_handlers_said, fix=REBUILD_FIX, fix_rank=1,
           plan_rank=1),
    Repair("images", "DL201", list, said=_images_said, fix=_image_fix,
           fix_rank=2),  # found in what a pickle drops (the planner)
    # Found by the planner, which starts again with each one:
    Repair("rebuilt", "DL201", list, said=_rebuilt_said, fix=REBUILD_FIX, fix_rank=1,
           runs_user_code=True),
    # Found where the probes met one (the planner):
    Repair("forwarders", "DL201", dict, said=_forwarders_said, fix=FORWARDER_FIX, fix_rank=3),
    Repair("locks", "DL201", lambda: None, meets=_lock_meets,
           reducers=_remedy("locks", "lock_reducers"),
           said=_locks_said, fix=LOCK_FIX, fix_rank=4, plan_rank=4),
)
BY_FIELD = {r.field: r for r in REPAIRS}
# The order in which a failure is offered to the repairs that look at failures.
OFFERED = tuple(sorted((r for r in REPAIRS if r.meets is not None), key=lambda r: r.plan_rank))


def offer(plan, meeting: Meeting, planned: dict) -> bool:
    """Offer a failure to the repairs in turn: the first that meets it adds its
    entry to ``plan`` and its reducers to ``planned``. Whether one took it."""
    for repair in OFFERED:
        entry = repair.meets(meeting) if repair.meets is not None else None
        if entry is None:
            continue
        if repair.add is not None:
            repair.add(plan, entry, meeting)
        elif isinstance(getattr(plan, repair.field), list):
            getattr(plan, repair.field).append(entry)
        else:
            setattr(plan, repair.field, entry)
        if repair.reducers is not None:
            planned.update(repair.reducers(entry))
        return True
    return False


def said_by(code: str, plan) -> list[Repair]:
    """The repairs of ``code`` that ``plan`` holds, in the order they are said."""
    return [r for r in REPAIRS if r.code == code and getattr(plan, r.field)]


def what_dl201_says(plan, args: dict[str, Any]) -> dict[str, Any] | None:
    """DL201's record for the repairs ``plan`` holds (but DL202, DL203 and
    DL208's): the finding's fields, or None where it holds none."""
    present = said_by("DL201", plan)
    if not present:
        return None
    before: dict[str, Any] = {}
    whys: list[str] = []
    done: list[str] = []
    repairs: list[str] = []
    remedies: list[Callable[[Any], Any]] = []
    for repair in present:
        if repair.said is None:
            continue
        said = repair.said(getattr(plan, repair.field), args)
        before.update(said.before)
        whys += said.whys
        done += said.done
        repairs += said.repairs
        remedies.append(said.remedy)
    fix = min(present, key=lambda r: r.fix_rank).fix
    fix = fix() if callable(fix) else fix
    return {"before": before, "why": "; ".join(whys), "remedies": remedies, "fix": fix,
            "strategy": "repair: %s in each worker" % " and ".join(repairs),
            "done": "%s in each of %s" % (" and ".join(done),
                                         number_of(args["num_workers"], "worker"))}


def read_only_files(args):
    """``(path, file)`` for each read-only file the parts hold (the reducers
    reopen every one of them), as the walk finds them."""
    from ..inspection import holdings
    from ..inspection.parts import PARTS

    found, seen = [], set()
    for name in PARTS:
        for held in holdings.find_files(args[name], name) \
                if args[name] is not None else ():
            if held.kind == holdings.READONLY and id(held.obj) not in seen:
                seen.add(id(held.obj))
                found.append((held.path, held.obj))
    return found


def memory_maps(args):
    """``(path, map)`` for each ``mmap.mmap`` the parts hold (the reducer maps
    every one of them again)."""
    import mmap

    from ..inspection.parts import held_in_parts

    return list(held_in_parts(args, lambda obj: type(obj) is mmap.mmap))


def not_importable(value):
    """A function or class a worker cannot import (a lambda, a local function or
    class), or an instance of such a class: cloudpickle can send it by value."""
    from ..inspection.mainmodule import importable_by_reference

    if is_a(value, (types.FunctionType, type)):
        return not importable_by_reference(value)
    cls = type(value)
    return "<locals>" in cls.__qualname__ or (
        cls.__module__ == "__main__" and not importable_by_reference(cls))


def by_value_part(part, failing):
    """``part`` (a collate_fn or worker_init_fn) with ``failing``, the function
    that does not pickle, sent by value; None when ``failing`` is not that
    function nor the user's own inside a worker_init_fn of ours."""
    from ..remedies import byvalue, workerinit

    if failing is part and callable(part):
        return byvalue.by_value(part)
    if failing is workerinit.user_function(part) and callable(failing):
        return workerinit.with_user_function(part, byvalue.by_value(failing))
    return None
