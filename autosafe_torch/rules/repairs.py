"""The registry of repairs that make a loader's parts reach spawn/forkserver
workers: one ``Repair`` per kind of holder, tried by ``pickling_plan`` in
``plan_rank`` order. DL202, DL203, DL208 and DL219 have records of their own;
DL201's one record says the others. A program adds a kind by ``REPAIRS.append``.
"""

from __future__ import annotations

import functools
import importlib
import types
from typing import Any, Callable, NamedTuple

from ..inspection import holdings
from ..inspection.naming import a_or_an
from ..inspection.objwalk import is_a
from . import number_of, what_is


class Meeting(NamedTuple):  # what a repair is shown where the probe failed
    failure: Any
    value: Any  # what did not pickle, and its class
    cls: type
    top: str  # the part it lies in
    why: str
    parts: dict[str, Any]  # as planned so far
    plan: Any
    owners: Any  # objwalk.Owners of the parts


class Said(NamedTuple):  # a repair's part of DL201's record
    before: dict[str, Any]  # what it acts on, by name
    whys: list[str]
    done: list[str]
    repairs: list[str]  # the words of the strategy
    remedy: Callable[[Any], Any] | None = None  # None: its reducers installed


class Look(NamedTuple):  # what a repair that finds its holders itself is shown
    parts: dict[str, Any]
    plan: Any
    planned: dict[type, Any]
    results: list[Any]


class Repair(NamedTuple):
    field: str  # the ``PicklingPlan`` field it fills
    code: str  # the rule whose record says it
    empty: Callable[[], Any]  # the field's value in a new plan
    # Where the probe failed: its entry (a list's item, a dict's items, else the field), or None.
    meets: Callable[[Meeting], Any] | None = None
    # A look of its own at a probe's outcome: (the field's value, falsy: none; the
    # failures it found that no worker can be given).
    looks: Callable[[Look], tuple[Any, list[Any]]] | None = None
    looks_when_met: str | None = None  # where the probes met this kind; None: once all pickled
    reducers: Callable[[Any], dict[type, Any]] | None = None  # tried by the probe, fix installs
    said: Callable[[Any, dict[str, Any]], Said] | None = None  # DL201's words
    summary: str = ""  # its part of DL201's summary and prevents
    prevents: str = ""
    fix: str | Callable[[], str] | None = None  # a callable: read where it is said
    fix_rank: int = 99  # DL201's fix: the first present by this rank
    plan_rank: int = 99
    # The rebuild calls a dataset's constructor in each worker (never here): a
    # last resort where no fork rung is safe, after which planning starts again.
    runs_user_code: bool = False
    carried: bool = False  # the parts reach workers without it


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

def _by_value_meets(m: Meeting):  # a collate_fn or worker_init_fn (or the user's in ours)
    if m.top not in ("collate_fn", "worker_init_fn"):
        return None
    from ..remedies import byvalue, workerinit

    part = m.parts[m.top]
    if m.value is part and callable(part):
        new = byvalue.by_value(part)
    elif m.value is workerinit.user_function(part) and callable(m.value):
        new = workerinit.with_user_function(part, byvalue.by_value(m.value))
    else:
        return None
    m.parts[m.top] = new  # the parts as planned send it so
    return {m.top: (new, m.why)}


def _nested_meets(m: Meeting):
    """A function or class a worker cannot import (a lambda, a local one), or an
    instance of such a class: cloudpickle sends it by value."""
    from ..inspection.mainmodule import importable_by_reference

    if m.plan.nested is not None:
        return None
    if is_a(m.value, (types.FunctionType, type)):
        unimportable = not importable_by_reference(m.value)
    else:
        cls = type(m.value)
        unimportable = "<locals>" in cls.__qualname__ or (
            cls.__module__ == "__main__" and not importable_by_reference(cls))
    return (m.failure.path, m.why) if unimportable else None


# -- DL203: classes of an interactive __main__ ---------------------------------------

def _class_meets(m: Meeting):
    from ..inspection.mainmodule import interactive_main

    if m.cls.__module__ == "__main__" and interactive_main() and m.cls not in m.plan.classes:
        return {m.cls: (m.failure.path, m.failure.error)}
    return None


# -- DL201: each holder, made again in each worker ------------------------------------

def _handler_meets(m: Meeting):
    handler = holdings.holding(m.owners, m.value)
    return handler if handler and handler[1] not in [h for _p, h in m.plan.handlers] else None


def _said(field, named, whys, done, words, remedy=None):  # named: [(path, obj)]
    return Said({field: [where for where, _obj in named]}, whys, [done % _named(named)], [words],
                remedy)


def _handlers_said(found, _args):
    return _said("handlers", found, ["a logging handler's lock and stream do not pickle"],
                 "%s made again from its file or stream", "make logging handlers again")


def _first_met(field, holding):
    """``meets`` from the first holder only (its reducers send every one):
    ``holding(m)``, what its entry keeps, None where ``m`` meets none."""
    def meets(m: Meeting):
        if getattr(m.plan, field) is None and (held := holding(m)) is not None:
            return (m.failure.path, m.failure.error, held)
        return None
    return meets


def _remedy(module, name, of=None):
    """``remedies.<module>.<name>(of(found))`` (``of`` None: no argument), imported when needed."""
    def call(found=None):
        made = getattr(importlib.import_module("autosafe_torch.remedies." + module), name)
        return made() if of is None else made(of(found))
    return call


def _files_said(found, args):
    """Every read-only file the parts hold (the reducers reopen each)."""
    from ..inspection.parts import PARTS
    from ..remedies import reopen

    path, why, held = found
    kept: dict[int, tuple[str, Any]] = {}  # each file once
    for name in PARTS:
        for f in holdings.find_files(args[name], name) if args[name] is not None else ():
            if f.kind == holdings.READONLY:
                kept.setdefault(id(f.obj), (f.path, f.obj))
    files = list(kept.values()) or [(path, held)]
    return _said("files", files, [why] + ["%s %s" % (where, note) for where, f in files
                                          for note in [reopen.read_only_note(f)] if note],
                 "%s reopened by path", "reopen read-only files by path")


def _maps_said(found, args):
    import mmap

    from ..inspection.mappings import anonymous
    from ..inspection.parts import held_in_parts

    path, why, held = found
    maps = list(held_in_parts(args, lambda obj: type(obj) is mmap.mmap)) or [(path, held)]
    named = [(where, m) for where, m in maps if not anonymous(m)]
    shared = [(where, m) for where, m in maps if anonymous(m)]
    done, repairs = [], []
    if named:
        done.append("%s mapped again from %s" % (
            _named(named), "its file" if len(named) == 1 else "their files"))
        repairs.append("map memory maps again by path")
    if shared:
        done.append("%s (anonymous) shared through one block of shared memory" % _named(shared))
        repairs.append("share anonymous maps")
    return Said({"maps": [where for where, _m in maps]}, [why], done, repairs)


def _locks_said(found, _args):
    path, why, named = found
    return Said({"locks": [where for where, _lock in named] or [path]}, [why],
                ["%s made anew, unlocked," % (_named(named) if named else path)],
                ["new unlocked locks"])


def _images_said(found, _args):
    return _said("images", [(where, img) for where, _why, img in found],
                 [why for _where, why, _img in found], "%s opened again at its frame",
                 "open images again")


def _rebuilt_said(found, _args):
    from ..remedies import rebuild

    datasets = [d for _where, d, _why in found]
    return _said("rebuilt", [(where, d) for where, d, _why in found],
                 [why for _where, _d, why in found],
                 "%s built again by its constructor's call, checked against this one there,",
                 "build the dataset again", lambda args: rebuild.install(datasets))


def _forwarders_said(found, _args):
    return Said({"forwarders": list(found.values())},
                ["a worker's unpickling of %s recurses in its __getattr__ (it asks the empty "
                 "instance for __setstate__)" % ", ".join(found.values())],
                ["%s rebuilt from its attributes" % ", ".join(
                    "%s (%s)" % (where, a_or_an(cls.__name__)) for cls, where in found.items())],
                ["rebuild attribute forwarders"])


def made_there(plan, path):
    """Whether ``path`` lies in what a repair that runs the user's code makes in
    each worker (a dataset built again)."""
    return any(path == held[0] or path.startswith((held[0] + ".", held[0] + "["))
               for r in REPAIRS if r.runs_user_code for held in getattr(plan, r.field))


def _pools_look(look: Look):
    dataset = look.parts["dataset"]
    return ([here for here, _pool, _edge in holdings.find_thread_pools(dataset)
             if not made_there(look.plan, here)] if dataset is not None else []), []


def _forwarders_look(look: Look):
    """``{class: path}``: the parts' attribute forwarders, each class once."""
    from ..inspection.parts import held_in_parts

    found: dict[type, str] = {}
    for here, obj in held_in_parts(look.parts, holdings.forwards_attributes):
        if not made_there(look.plan, here):
            found.setdefault(type(obj), here)
    return found, []


def _images_look(look: Look):
    """What pickles but drops an open file its methods use (``inspection/dropped.py``),
    looked for where the probes met an image or a file is open for reading (such
    a pickle never meets it): images opened again, else failures."""
    from ..inspection import dropped
    from ..inspection.descriptors import shared_at_fork

    if "image" not in look.plan.met and not shared_at_fork():
        return None, []
    found = [f for f in dropped.unfaithful(look.parts, look.planned)
             if not made_there(look.plan, f.path)]
    if found and not look.plan.images and all(dropped.reopens(f.value) for f in found):
        return [(f.path, f.error, f.value) for f in found], []
    return None, found


def _loggers_look(look: Look):
    """The configured loggers the probes met (DL219); as failures, those whose
    configuration cannot be carried (the remedy pickles what it would send)."""
    from ..inspection.probe import ProbeResult
    from ..remedies import loggers

    held = {id(lg): lg for r in look.results for lg in r.loggers}.values()
    found = [lg for lg in held if holdings.configured(lg)]
    return found, [ProbeResult(False, "the logger %r" % lg.name, "%s, and without it the lines "
                               "logged in a worker are lost" % why, lg)
                   for lg in found for why in [loggers.uncarried(lg)] if why is not None]


def _rebuilt_meets(m: Meeting):
    """The innermost dataset holding the failure that may be built again."""
    from ..remedies import rebuild

    if len(m.plan.rebuilt) >= MAX_REPAIRS:
        return None
    here, dataset, refusal = rebuild.rebuildable_owner(m.owners, m.value)
    m.plan.refused += [refusal] if refusal else []
    return None if dataset is None else (here, dataset, m.why)


# The repairs, in the order DL201 says them.
REPAIRS: list[Repair] = [
    Repair("by_value", "DL202", dict, meets=_by_value_meets, plan_rank=0),
    Repair("nested", "DL202", lambda: None, meets=_nested_meets, plan_rank=6),
    Repair("classes", "DL203", dict, meets=_class_meets,
           reducers=_remedy("byvalue", "class_reducers", list), plan_rank=5),
    Repair("pools", "DL208", list, looks=_pools_look, looks_when_met="pool",
           reducers=_remedy("pools", "pool_reducers"), plan_rank=0),
    Repair("files", "DL201", lambda: None,
           meets=_first_met("files", lambda m: m.value if holdings.file_kind(m.value)
                            == holdings.READONLY else None),
           reducers=_remedy("reopen", "file_reducers"), said=_files_said,
           summary="reopen read-only files per worker",
           prevents=("TypeError: cannot pickle '_io.BufferedReader' object (also "
                     "'sqlite3.Connection', h5py and lmdb handles)"), fix_rank=0, plan_rank=2),
    Repair("maps", "DL201", lambda: None,
           meets=_first_met("maps", lambda m: m.value if importlib.import_module(
               "autosafe_torch.inspection.mappings").travels(m.value) else None),
           reducers=_remedy("memmaps", "map_reducers"), said=_maps_said,
           summary=("map an mmap.mmap of a named file again in each worker with its access "
                    "and position, share an anonymous one through one block of shared memory"),
           prevents="TypeError: cannot pickle 'mmap.mmap' object", fix_rank=0, plan_rank=3),
    Repair("handlers", "DL201", list, meets=_handler_meets, reducers=_remedy(
               "handlers", "handler_reducers", lambda found: {type(h) for _w, h in found}),
           said=_handlers_said, summary="make logging handlers again from their file or stream",
           prevents="TypeError: cannot pickle '_thread.RLock' object (a logging handler's lock)",
           fix=REBUILD_FIX, fix_rank=1, plan_rank=1),
    Repair("images", "DL201", list, looks=_images_look,
           reducers=_remedy("images", "image_reducers"), said=_images_said,
           summary="open an image of several frames again at its frame",
           prevents=("AttributeError: 'TiffImageFile' object has no attribute '_min_frame' in "
                     "a worker (an image's pickle dropped its file)"),
           fix=lambda: importlib.import_module("autosafe_torch.inspection.dropped").IMAGE_FIX,
           fix_rank=2, plan_rank=2),  # read where it is said: imported with an image met
    Repair("rebuilt", "DL201", list, meets=_rebuilt_meets, reducers=_remedy(
               "rebuild", "planned_reducers", lambda found: [d for _w, d, _why in found]),
           said=_rebuilt_said, summary=(
               "build the dataset again in each worker by the call that built it (recorded, "
               "never run here), each worker checking that it opened the same files in the "
               "same order and holds the same values"),
           prevents=("TypeError: cannot pickle 'builtins.safe_open' object (also pyarrow's "
                     "ParquetReader, pandas' TextReader)"),
           fix=REBUILD_FIX, fix_rank=1, runs_user_code=True),
    Repair("forwarders", "DL201", dict, looks=_forwarders_look, looks_when_met="forwarder",
           reducers=_remedy("pickling", "forwarder_reducers", list), said=_forwarders_said,
           summary="rebuild forwarders from their attributes",
           prevents=("RecursionError in a worker unpickling a __getattr__ forwarder "
                     "(DataLoader worker exited unexpectedly)"),
           fix=FORWARDER_FIX, fix_rank=3, plan_rank=1),
    Repair("locks", "DL201", lambda: None,
           meets=_first_met("locks", lambda m: holdings.users_locks(m.parts, m.value)),
           reducers=_remedy("locks", "lock_reducers"), said=_locks_said,
           summary="send the user's locks nobody holds as new, unlocked ones",
           prevents="TypeError: cannot pickle '_thread.lock' object", fix=LOCK_FIX, fix_rank=4,
           plan_rank=4),
    Repair("loggers", "DL219", list, looks=_loggers_look, plan_rank=3, carried=True),
]
MAX_REPAIRS = 16  # one failure is found per probe; a dataset has few kinds


def by_rank(hook: str) -> list[Repair]:
    """The repairs with ``hook`` by ``plan_rank``, ``runs_user_code`` last."""
    return sorted((r for r in REPAIRS if getattr(r, hook) is not None),
                  key=lambda r: (r.runs_user_code, r.plan_rank))


def hold(plan, planned: dict, repair: Repair, found) -> None:
    """``found`` as ``repair``'s field of ``plan``, its reducers in ``planned``."""
    setattr(plan, repair.field, found)
    if repair.reducers is not None:
        planned.update(repair.reducers(found))


def offer(plan, meeting: Meeting, planned: dict, may_run_user_code=lambda: False
          ) -> Repair | None:
    """Offer a failure to the repairs in turn (those that run the user's code
    where ``may_run_user_code()``): the first that meets it holds its entry."""
    for repair in by_rank("meets"):
        if repair.meets is None or repair.runs_user_code and not may_run_user_code():
            continue
        entry = repair.meets(meeting)
        if entry is None:
            continue
        held = getattr(plan, repair.field)
        if isinstance(held, (list, dict)):
            entry = held + [entry] if isinstance(held, list) else {**held, **entry}
        hold(plan, planned, repair, entry)
        return repair
    return None


def look(view: Look, failures: list, looked: set) -> tuple[list, bool]:
    """Show a probe's outcome to the repairs that look: where the probes met
    their kind, once each (``looked``); else while nothing fails. The failures,
    and whether one planned reducers (the parts are probed again)."""
    for repair in by_rank("looks"):
        when = repair.looks_when_met
        if repair.looks is None or (when in looked or when not in view.plan.met if when
                                    else failures):
            continue
        looked.add(when)
        found, failing = repair.looks(view)
        if found:
            hold(view.plan, view.planned, repair, found)
            if repair.reducers is not None:
                return [], True
        if failing:
            return failing, False
    return failures, False


def what_dl201_says(plan, args: dict[str, Any]) -> dict[str, Any] | None:
    """The fields of DL201's finding for its repairs ``plan`` holds, or None."""
    present = [r for r in REPAIRS if r.code == "DL201" and getattr(plan, r.field)]
    if not present:
        return None
    said = [(r, r.said(getattr(plan, r.field), args)) for r in present if r.said is not None]
    fix = min(present, key=lambda r: r.fix_rank).fix
    return {"before": {k: v for _r, s in said for k, v in s.before.items()},
            "why": "; ".join(w for _r, s in said for w in s.whys),
            "fix": fix() if callable(fix) else fix,
            "remedies": [s.remedy or functools.partial(_install, r.reducers,
                                                       getattr(plan, r.field)) for r, s in said],
            "strategy": "repair: %s in each worker" % " and ".join(
                w for _r, s in said for w in s.repairs),
            "done": "%s in each of %s" % (" and ".join(d for _r, s in said for d in s.done),
                                         number_of(args["num_workers"], "worker"))}


def _install(reducers, found, _args):
    """A repair's remedy in fix mode."""
    from ..remedies import pickling

    pickling.install(reducers(found))
