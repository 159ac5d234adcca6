"""One bounded walk over the objects a dataset holds, shared by every check,
so that the probe and the repairs see the same objects under the same names.

It follows what pickling follows for ordinary objects (``__dict__``,
``__slots__``, container items, dict keys, a ``functools.partial``'s parts),
never copies, iterates only built-in containers (a generator is never
consumed), and never enters modules, classes or functions (a module would
reach everything). It survives any object (numpy's NpzFile.f, a ``__getattr__``
delegator, a lazy-module proxy): only the object that raises is skipped.
"""

import collections
import functools
import pickle
import sys
import types
from itertools import islice

from .slots import attributes, instance_dict, slot_names  # noqa: F401 - read here by holdings and copies

MAX_DEPTH = 24
MAX_OBJECTS = 200_000  # objects entered in Python: large plain containers are read in C

# Leaves: nothing reachable from them matters to a worker hazard.
ATOMIC = (type(None), bool, int, float, complex, str, bytes, bytearray,
          range, slice, type(Ellipsis), type(NotImplemented))
CODE = (types.FunctionType, types.BuiltinFunctionType, types.MethodType, type,
        types.ModuleType, types.CodeType, types.FrameType)
OPAQUE = CODE + (types.GeneratorType, types.CoroutineType, types.AsyncGeneratorType, memoryview)
NULL_SINK = types.SimpleNamespace(write=len)  # a file that keeps nothing


class Edge(collections.namedtuple("Edge", "owner key how child")):
    """How a child hangs from its owner: a path label, and a way to replace it."""

    __slots__ = ()
    ATTR, ITEM, KEY, MEMBER, PART = "attr", "item", "key", "member", "part"
    LABELS = {ATTR: ".%s", PART: ".%s", ITEM: "[%r]", KEY: "<key %r>", MEMBER: "<member %d>"}

    def label(self):
        return self.LABELS[self.how] % (self.key,)

    @property
    def settable(self):
        """Whether ``set`` can replace the child in place (tuple items cannot)."""
        return self.how == Edge.ATTR or self.how == Edge.ITEM and is_a(self.owner, (list, dict))

    def set(self, new):
        if self.how == Edge.ATTR:
            try:
                setattr(self.owner, self.key, new)
            except AttributeError:  # a read-only property over __dict__
                self.owner.__dict__[self.key] = new
        elif self.settable:
            self.owner[self.key] = new
        else:
            raise TypeError("cannot replace an item of %s in place" % type(self.owner).__name__)


def is_a(obj, classes):
    """``isinstance`` by the object's real type, asking the object nothing (its
    ``__class__`` may raise, or lie as a proxy's does); False where that raises."""
    try:
        return issubclass(type(obj), classes)
    except Exception:
        return False


def is_leaf(obj):
    if is_a(obj, ATOMIC + OPAQUE):
        return True
    torch = sys.modules.get("torch")
    if torch is not None and is_a(obj, _tensor_kinds(torch)):
        return True
    numpy = sys.modules.get("numpy")
    return numpy is not None and is_a(obj, (numpy.ndarray, numpy.generic))


@functools.lru_cache(maxsize=1)
def _tensor_kinds(torch):
    storage = getattr(torch, "storage", None)
    return (torch.Tensor,) + tuple(getattr(storage, n) for n in ("TypedStorage", "UntypedStorage")
                                   if storage is not None and hasattr(storage, n))


# A built-in container this large is first read whole in C (``plain``): one of
# plain values only (an index of a million (path, class) tuples) is not entered.
PLAIN_AT = 1024
CONTAINERS = (list, tuple, dict, set, frozenset)
_plain_known = {}  # id -> (the container, plain?): kept alive while known (forget())


class _PlainOnly(pickle.Pickler):
    def reducer_override(self, obj):
        raise TypeError  # anything but plain values and built-in containers


def plain(container):
    """Whether a built-in container holds plain values only: the C pickler reads
    those and calls back for anything else, which stops it."""
    known = _plain_known.get(id(container))
    if known is not None and known[0] is container:
        return known[1]
    try:
        _PlainOnly(NULL_SINK).dump(container)
        result = True
    except Exception:  # not plain; or too deep, a cycle the memo would take: not known plain
        result = False
    if len(_plain_known) < 256:
        _plain_known[id(container)] = (container, result)
    return result


def forget():
    """Once a decision is made: the objects ``plain`` read may change."""
    _plain_known.clear()


def edges(obj, items=None):
    """The children of ``obj`` as ``Edge`` objects, in a stable order (a large
    plain container has none)."""
    if is_leaf(obj):
        return
    if type(obj) in CONTAINERS and (items is None or items > PLAIN_AT) \
            and len(obj) > PLAIN_AT and plain(obj):
        return
    if is_a(obj, dict):
        for key, value in list(islice(dict.items(obj), items)):
            if not is_a(key, ATOMIC):
                yield Edge(obj, key, Edge.KEY, key)
            yield Edge(obj, key, Edge.ITEM, value)
    elif is_a(obj, (list, tuple, set, frozenset)):
        # The built-in iterators: a subclass's own __iter__ is user code.
        base = next(b for b in (list, tuple, set, frozenset) if is_a(obj, b))
        how = Edge.ITEM if base in (list, tuple) else Edge.MEMBER
        for index, value in enumerate(list(islice(base.__iter__(obj), items))):
            yield Edge(obj, index, how, value)
    elif is_a(obj, functools.partial):  # what it pickles: func, args, keywords
        yield Edge(obj, "func", Edge.PART, functools.partial.func.__get__(obj))
        for index, value in enumerate(functools.partial.args.__get__(obj)):
            yield Edge(obj, "args[%d]" % index, Edge.PART, value)
        for key, value in (functools.partial.keywords.__get__(obj) or {}).items():
            yield Edge(obj, "keywords[%r]" % (key,), Edge.PART, value)
    for name, value in attributes(obj):
        if type(name) is str:
            yield Edge(obj, name, Edge.ATTR, value)


def walk(root, path="dataset", max_objects=MAX_OBJECTS, stop=None, items=None, on_cut=None):
    """``(path, obj, edge)`` for ``root`` (edge None) and what it holds, depth
    first, each object once. ``stop(obj)`` true: not entered; raising: skipped.
    ``items``: at most that many of each container's; ``on_cut()``: called
    when a bound (depth, objects) leaves something unseen."""
    seen = set()
    stack = [(path, root, None, 0)]
    while stack:
        if len(seen) >= max_objects:
            if on_cut is not None:
                on_cut()
            return
        here, obj, edge, depth = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        try:
            stopped = stop is not None and stop(obj)
        except Exception:  # an object no check can look at: skipped, the walk goes on
            continue
        yield here, obj, edge
        if stopped:
            continue
        if depth >= MAX_DEPTH:
            if on_cut is not None and not is_leaf(obj):
                on_cut()
            continue
        try:
            children = list(edges(obj, items))
        except Exception:  # a hostile __getattr__ or a mutating container
            continue
        for child_edge in reversed(children):
            child = child_edge.child
            if is_a(child, ATOMIC) or id(child) in seen:
                continue
            stack.append((here + child_edge.label(), child, child_edge, depth + 1))


class Owners:
    """Who holds what in the loader's parts, from one walk: ``met`` (``(path, obj)``),
    ``owner(obj)``, ``chain(obj)`` (``(path, holder)`` out to the part)."""

    def __init__(self, parts):
        self._owner, self._path, self.met = {}, {}, []
        for name, part in parts.items():
            if part is None:
                continue
            for here, obj, edge in walk(part, name):
                self.met.append((here, obj))  # ids stay theirs while this lives
                self._path.setdefault(id(obj), here)
                if edge is not None:
                    self._owner.setdefault(id(obj), edge.owner)

    def owner(self, obj):
        return self._owner.get(id(obj))

    def chain(self, obj):
        seen = set()
        while obj is not None and id(obj) in self._path and id(obj) not in seen:
            seen.add(id(obj))
            yield self._path[id(obj)], obj
            obj = self._owner.get(id(obj))
