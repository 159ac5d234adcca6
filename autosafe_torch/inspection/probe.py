"""Will this object reach a spawn/forkserver worker, and if not, which part fails?

An inventory pass with a worker's dispatch table (``sent_table``) into a null
sink: its cost grows with the number of objects, never with their bytes. It
also meets what only the child fails on: a class or function of an interactive
``__main__`` (``python -c``, stdin, a notebook), or under ``if __name__ ==
"__main__":``, pickles by reference and is missing from the child's ``__mp_main__``.
"""

import contextlib
import copyreg
import dataclasses
import functools
import io
import pickle
import sys
import types
from itertools import islice
from typing import Any

from ..mp_private import extra_reducers, semlock_of
from . import inventory, objwalk
from .inventory import PROTOCOL, is_probing  # noqa: F401 - is_probing: read from here
from .failures import exception_text, kept
from .mainmodule import importable_by_reference, missing_in_child

# Pickling is never cut short (a partial dump proves nothing); locating a failure
# descends at most objwalk.MAX_DEPTH levels, and stops past this many objects pickled.
MAX_PICKLED = 2_000_000


@dataclasses.dataclass(eq=False)
class ProbeResult:
    """``ok``, or where it fails: ``path``, ``error``, the offending ``value``
    (``fix``: its own permanent fix); ``kinds`` and ``loggers``: what the pass
    met up to its failure; the rest: ``probe``'s."""

    ok: bool
    path: str
    error: Any = None
    value: Any = None
    objects: int = 0
    loggers: tuple = ()
    pickled: Any = None
    meets: bool = False
    kinds: frozenset = frozenset()
    fix: Any = None

    def __bool__(self):
        return self.ok

    def __repr__(self):
        if self.ok:
            return "ProbeResult(ok, %s, objects=%d)" % (self.path, self.objects)
        return "ProbeResult(%s: %s)" % (self.path, self.error)


def sent_table(planned=None):
    """ForkingPickler's dispatch table (copyreg's, torch's, the program's), plus
    ``planned``: a repair installed for another loader does not count, each
    loader is planned as if it were the only one."""
    table = {**copyreg.dispatch_table, **extra_reducers()}
    if sys.version_info < (3, 10):
        table.update(_fork_semlock_reducers())
    table.update(planned or {})
    return table


def _fork_semlock_reducers():
    """Python 3.9 pickles a lock or semaphore of a fork context for a spawned
    child, which then fails to open it (its name was unlinked at creation):
    refuse it as Python 3.10 and later do."""
    from multiprocessing import synchronize  # noqa: PLC0415 - raises ImportError where the platform lacks sem_open; probe must load there

    def reduce(lock):
        if sys.platform != "win32" and semlock_of(lock).name is None:
            raise RuntimeError("A SemLock created in a fork context is being shared with a "
                               "process in a spawn context. This is not supported. Please "
                               "use the same context to create multiprocessing objects and "
                               "Process.")
        return lock.__reduce_ex__(PROTOCOL)

    return {cls: reduce for cls in (synchronize.Lock, synchronize.RLock, synchronize.Semaphore,
                                    synchronize.BoundedSemaphore)}


def _by_value_parts(obj):
    """What sending ``obj`` by value (cloudpickle) pickles besides code: a function's
    closure, named globals (modules by reference), defaults; a class's bases and attributes."""
    if isinstance(obj, type):
        return (obj.__bases__, {k: v for k, v in vars(obj).items()
                                if k not in ("__dict__", "__weakref__")})
    code = obj.__code__
    names = set(code.co_names).union(*(const.co_names for const in code.co_consts
                                       if isinstance(const, types.CodeType)))
    refs = {name: obj.__globals__[name] for name in sorted(names)
            if name in obj.__globals__ and not isinstance(obj.__globals__[name], types.ModuleType)}
    cells = []
    for cell in obj.__closure__ or ():
        with contextlib.suppress(ValueError):  # an empty cell
            cells.append(cell.cell_contents)
    return (tuple(cells), refs, obj.__defaults__, obj.__kwdefaults__, obj.__dict__)


def _children(obj, table):
    """``(label, child)`` of ``obj`` in the order pickling would save them."""
    if objwalk.is_leaf(obj):  # classes and functions included
        return []
    if type(obj) in objwalk.CONTAINERS \
            or objwalk.is_a(obj, functools.partial):  # func, args, keywords, __dict__
        return [(e.label(), e.child) for e in objwalk.edges(obj)]
    try:
        reducer = table.get(type(obj))
        rv = reducer(obj) if reducer is not None else obj.__reduce_ex__(PROTOCOL)
    except Exception:
        return []  # it fails itself: a leaf
    if not isinstance(rv, tuple) or len(rv) < 2:
        return []
    found = []
    func, args, state, listitems, dictitems = (rv + (None,) * 3)[:5]
    for i, arg in enumerate(args or ()):
        if isinstance(arg, type) and (arg is type(obj) or i == 0 and func in (
                copyreg.__newobj__, copyreg.__newobj_ex__, copyreg._reconstructor)):
            continue  # the object's own class: a failure there is the object's
        found.append(("<arg %d>" % i, arg))
    if isinstance(state, tuple) and len(state) == 2 and all(
            s is None or isinstance(s, dict) for s in state):
        state = {**(state[0] or {}), **(state[1] or {})}
    if isinstance(state, dict):
        found.extend(("." + k if isinstance(k, str) else "[%r]" % (k,), v)
                     for k, v in state.items())
    elif state is not None:
        found.append(("<state>", state))
    found.extend(("[%d]" % i, item) for i, item in enumerate(islice(listitems or (), 10_000)))
    found.extend(("[%r]" % (item[0],), item[1]) for item in islice(dictitems or (), 10_000))
    return found


def _locate(obj, path, table, by_value):
    """``(value, path, exception, objects)``: the innermost part of ``obj`` that fails
    alone (exception None: ``obj`` pickles), its ancestors counted as pickled already;
    ``objects``: what those passes met."""

    def first_error(obj, known=()):
        found = inventory.take(obj, table, _code_sent(by_value), known=known)
        return (found.unpicklable[0][1] if found.unpicklable else found.error), found.objects

    exc, objects = first_error(obj)
    ancestors = [obj]
    for _ in range(objwalk.MAX_DEPTH):
        if exc is None or objects > MAX_PICKLED:
            break
        try:
            children = _children(obj, table)
        except Exception:  # an object that cannot even be looked at: the failure is here
            break
        for label, child in children:
            if objwalk.is_a(child, objwalk.ATOMIC) or any(child is a for a in ancestors):
                continue
            child_exc, met = first_error(child, ancestors)
            objects += met
            if child_exc is not None:
                obj, path, exc = child, path + label, child_exc
                ancestors.append(child)
                break
        else:
            break
    return obj, path, exc, objects


def probe(obj, path="dataset", planned=None, by_value=False, keep=False, watch=None):
    """Whether ``obj`` pickles for a spawn/forkserver worker; if not, where and why.

    ``planned``: ``{class: reducer}`` a repair would register; ``by_value``: as
    if code a worker cannot import were sent by value; ``keep``: ``pickled``
    holds the pickle where the same bytes may go to every worker; ``watch``: an
    object whose meeting ``meets`` says (the dataset, in another part: then its
    bytes cannot go apart)."""
    table = sent_table(planned)
    sink = io.BytesIO() if keep else None
    found = inventory.take(obj, table, _code_sent(by_value), sink)
    result = functools.partial(ProbeResult, loggers=tuple(found.of("logger")),
                               kinds=frozenset(found.found))
    if not found.unpicklable and found.complete:
        pickled = sink.getvalue() if keep and inventory.sent_as_is(found) else None
        return result(True, path, objects=found.objects, pickled=pickled,
                      meets=id(watch) in found.met)
    if found.unpicklable:
        value, exc = found.unpicklable[0]
        where = inventory.path_of(value, obj, path)
        if where is not None:
            return result(False, where, exception_text(exc), value, found.objects)
    value, where, exc, objects = _locate(obj, path, table, by_value)
    if exc is None:  # the pass's own limit (too deep), not pickle's
        return result(True, path, objects=found.objects)
    return result(False, where, exception_text(exc), value, objects)


def _code_sent(by_value):
    """``inventory.take``'s ``code``: by value where the DL202 repair sends it so."""
    sent = set()

    def code(obj):
        if not objwalk.is_a(obj, (type, types.FunctionType)):
            return NotImplemented
        if by_value and not importable_by_reference(obj):
            if id(obj) in sent:  # a class its own methods name
                return inventory.stand_in, ()
            sent.add(id(obj))
            return inventory.stand_in, _by_value_parts(obj)
        if getattr(obj, "__module__", None) == "__main__":
            error = missing_in_child(obj)
            if error is not None:  # the child's __main__ lacks it
                return AttributeError(error)
        if not importable_by_reference(obj):
            try:
                pickle.dumps(obj, PROTOCOL)  # by reference: pickle's own words
            except Exception as exc:
                return kept(exc)
        return NotImplemented

    return code
