"""What the workers' code reads from the process: module globals and class
attributes, found in the code, never by running it (a spawned worker has
them at their import-time value: ``remedies/process_state.py``).

A worker runs what torch sends it: the dataset (and the datasets,
transforms and callables among its attributes), ``collate_fn`` and
``worker_init_fn``, never the sampler. From the methods it calls on those
(``ENTRIES``), transitively, what the program's own code names: a global,
an attribute on a class of the program in scope (``self.mean``,
``type(self).mean``) or on a module of the program (``config.LR``), a
function of the program put on a library's module (``np.load = my_load``).

Cost: each code object is read once per process (``dis``, cached), objects
only through their attributes (a few hundred at most; containers only
while small: never a dataset's samples), from ``__dict__`` and
``__slots__``: no user code runs.
"""

from __future__ import annotations

import dataclasses
import dis
import functools
import sys
import types
from collections.abc import Iterable
from typing import Any

from .. import callsite
from .digest import attributes, main_name
from .holdings import loaded, users_module
from .mainmodule import importable_by_reference
from .objwalk import is_a

# The methods a worker calls on what it is sent (torch's loop, pickle's
# ``__setstate__``, the program's code). Not construction: a worker unpickles,
# never builds (but the rebuild rung's datasets: ``reads_of(rebuilt=...)``).
ENTRIES = ("__getitem__", "__getitems__", "__len__", "__iter__", "__next__", "__call__",
           "__setstate__", "__getattr__", "__getattribute__", "__contains__", "__bool__",
           "__enter__", "__exit__")
CONSTRUCTION = ("__new__", "__init__", "__post_init__")
MAX_OBJECTS = 512  # objects looked at per loader (through attributes, never samples)
MAX_ITEMS = 64     # a container larger than this is data, not code to follow
_NAMES = {**dict.fromkeys(("LOAD_GLOBAL", "LOAD_NAME", "STORE_GLOBAL", "DELETE_GLOBAL"),
                          "globals"),
          **dict.fromkeys(("LOAD_ATTR", "LOAD_METHOD", "STORE_ATTR", "LOAD_SUPER_ATTR",
                           "DELETE_ATTR", "IMPORT_FROM"), "attrs"),
          "IMPORT_NAME": "imports"}  # opcode -> which of _Code's tables its name goes in
_PLAIN = (type(None), bool, int, float, complex, str, bytes, bytearray, range, slice)


@dataclasses.dataclass(frozen=True)
class Read:
    """One value the workers' code reads from the process: ``name`` (dotted:
    ``Spectra.mean`` for a class attribute) under ``module`` (``__main__`` for
    the script), first read at ``site`` (``/path/train.py:14``)."""

    module: str
    name: str
    site: str

    @property
    def label(self) -> str:
        """How a person names it: ``CONFIG``, ``Spectra.mean`` in the script;
        ``config.LR`` elsewhere."""
        return self.name if main_name(self.module) == "__main__" else self.module + "." + self.name


@dataclasses.dataclass(frozen=True)
class _Code:
    """What one code object (with its nested code) names, ``{name: first line}``:
    globals, attributes (``from m import name`` too) and modules it imports."""

    filename: str
    globals: dict[str, int]
    attrs: dict[str, int]
    imports: dict[str, int]


@functools.lru_cache(maxsize=4096)
def _code(code: types.CodeType) -> _Code:
    facts = _Code(code.co_filename, {}, {}, {})
    _scan(code, facts, 0)
    return facts


def _scan(code: types.CodeType, facts: _Code, depth: int) -> None:
    line = code.co_firstlineno
    for instruction in dis.get_instructions(code):
        line = callsite.line_of(instruction, line)
        table = _NAMES.get(instruction.opname)
        if table is not None and isinstance(instruction.argval, str):
            getattr(facts, table).setdefault(instruction.argval, line)
    if depth < 8:
        for const in code.co_consts:  # comprehensions, lambdas, inner functions
            if isinstance(const, types.CodeType):
                _scan(const, facts, depth + 1)


_module_is_programs = functools.lru_cache(maxsize=1024)(users_module)


def is_programs(obj: Any) -> bool:
    name = getattr(obj, "__module__", None)
    return isinstance(name, str) and _module_is_programs(name)


class _Walk:
    def __init__(self) -> None:
        self.found: dict[tuple[str, str], Read] = {}
        self.objects: set[int] = set()
        self.functions: set[tuple[Any, ...]] = set()
        self.classes: set[int] = set()
        self.sent: set[int] = set()  # the classes of instances the workers are sent
        self.budget = MAX_OBJECTS

    # -- objects: what torch sends, and what their attributes hold --

    def object(self, obj: Any) -> None:
        if is_a(obj, _PLAIN) or id(obj) in self.objects or self.budget <= 0:
            return
        self.objects.add(id(obj))
        self.budget -= 1
        if is_a(obj, types.FunctionType):
            self.function(obj, ())
        elif is_a(obj, types.MethodType):
            owner = obj.__self__
            self.object(owner)
            self.function(obj.__func__, _mro(owner if isinstance(owner, type) else type(owner)))
        elif is_a(obj, functools.partial):
            for part in (obj.func, *obj.args, *obj.keywords.values()):
                self.object(part)
        elif is_a(obj, (staticmethod, classmethod)):
            self.object(obj.__func__)
        elif is_a(obj, type):
            self.klass(obj)
        elif is_a(obj, (list, tuple, set, frozenset, dict)):
            if len(obj) <= MAX_ITEMS:
                for item in obj.values() if is_a(obj, dict) else obj:
                    self.object(item)
        elif not is_a(obj, (types.ModuleType, types.BuiltinFunctionType)):
            self.instance(obj)

    def instance(self, obj: Any) -> None:
        cls = type(obj)
        if is_programs(cls):
            self.sent.add(id(cls))
            classes = _mro(cls) if importable_by_reference(cls) else ()
            self.methods(classes, ENTRIES, frozenset(dict(attributes(obj, MAX_ITEMS * 4))))
        elif not (callable(obj) or _one_of(obj, *_DATASETS)):
            # A library's data object (a DataFrame, a file): no code of the program. A
            # library's dataset or sampler (Subset, ConcatDataset) may hold the program's.
            return
        for _name, value in attributes(obj, MAX_ITEMS * 4):
            if is_a(value, _PLAIN) or _one_of(value, *_PAYLOADS):
                continue
            self.object(value)

    def klass(self, cls: type) -> None:
        """A class the code names: what building it runs (``Helper(x)`` in
        ``__getitem__``); not for a class the workers are sent an instance of
        (naming it reads its attributes: ``Spectra.mean``), nor one by value."""
        if id(cls) in self.classes or id(cls) in self.sent or not is_programs(cls) \
                or not importable_by_reference(cls):
            return
        self.classes.add(id(cls))
        self.methods(_mro(cls), CONSTRUCTION)

    def methods(self, classes: tuple[type, ...], names: tuple[str, ...],
                held: frozenset[str] = frozenset()) -> None:
        for klass in classes:
            for name in names:
                if name in vars(klass):
                    for function in _functions_of(vars(klass)[name]):
                        self.function(function, classes, held)

    # -- code --

    def function(self, function: Any, classes: tuple[type, ...],
                 held: frozenset[str] = frozenset()) -> None:
        """``function``'s reads. ``classes``: the program's classes along the
        MRO of the instance it is a method of; else a free function, read where
        it goes by reference (by value, a lambda's globals travel with it)."""
        if not is_a(function, types.FunctionType) or not is_programs(function):
            return  # a library's code is not read
        if not classes and not importable_by_reference(function):
            return
        code = function.__code__
        key = (code, id(function.__globals__), classes)
        if key in self.functions or len(self.functions) > 4 * MAX_OBJECTS:
            return
        self.functions.add(key)
        facts = _code(code)
        scope = function.__globals__
        module = main_name(scope.get("__name__", "?"))
        named = list(classes)
        for name, line in facts.globals.items():
            if name not in scope or name.startswith("__") and name.endswith("__"):
                continue  # a builtin, not defined yet, or the module's own (__name__)
            value = scope[name]
            if is_a(value, types.ModuleType):
                self.module_attributes(value, facts)
                continue
            self.add(module, name, facts.filename, line)
            if is_a(value, type) and is_programs(value):
                named.extend(k for k in _mro(value) if k not in named)
            self.follow(value)
        self.class_attributes(tuple(named), facts, held)
        for name in facts.imports:
            imported = sys.modules.get(name)
            if imported is not None:
                self.module_attributes(imported, facts)
        for cell in function.__closure__ or ():
            try:
                self.object(cell.cell_contents)
            except ValueError:  # an empty cell
                continue
        for value in (function.__defaults__ or ()) + tuple((function.__kwdefaults__ or {})
                                                             .values()):
            self.object(value)

    def class_attributes(self, classes: tuple[type, ...], facts: _Code,
                         held: frozenset[str]) -> None:
        """The attributes ``facts`` names that a class in scope has (the first
        along the MRO, as lookup finds it): methods followed, data a read,
        unless the instance holds its own."""
        for name, line in facts.attrs.items():
            if name in held:
                continue
            for klass in classes:
                if name not in vars(klass):
                    continue
                value = vars(klass)[name]
                functions = _functions_of(value)
                for function in functions:
                    self.function(function, classes)
                qualname = getattr(klass, "__qualname__", None)  # leads back to it, without "<"
                if isinstance(qualname, str) and "<" not in qualname \
                        and not (name.startswith("__") and name.endswith("__")) \
                        and not _defined_in(functions, qualname):
                    # data, or a function put there (Scaled.scale = lambda ...): a binding
                    self.add(main_name(klass.__module__), "%s.%s" % (qualname, name),
                             facts.filename, line)
                    if is_a(value, type):
                        self.klass(value)
                break

    def module_attributes(self, module: types.ModuleType, facts: _Code) -> None:
        """The attributes ``facts`` names on ``module``: the program's values
        (``config.LR``), or a function of the program put on a library's."""
        own = _module_is_programs(module.__name__)
        table = vars(module)
        for name, line in facts.attrs.items():
            if name not in table:
                continue
            value = table[name]
            if is_a(value, types.ModuleType):
                continue
            if own:
                self.add(main_name(module.__name__), name, facts.filename, line)
                self.follow(value)
            elif is_a(value, types.FunctionType) and is_programs(value):
                self.add(module.__name__, name, facts.filename, line)  # replaced in a library
                self.function(value, ())

    def follow(self, value: Any) -> None:
        """A value the code names: its code, a class's construction, an object's attributes."""
        if is_a(value, types.FunctionType):
            self.function(value, ())
        elif is_a(value, type):
            self.klass(value)
        else:
            self.object(value)

    def add(self, module: str, name: str, filename: str, line: int) -> None:
        self.found.setdefault((module, name), Read(module, name, callsite.place(filename, line)))


def _mro(cls: type) -> tuple[type, ...]:
    """The program's own classes along ``cls``'s MRO."""
    try:
        return tuple(k for k in cls.__mro__ if is_programs(k))
    except Exception:
        return ()


def _functions_of(value: Any) -> list[Any]:
    """The plain functions behind a class attribute (a property's accessors;
    ``__wrapped__`` where a decorator of ours measured it)."""
    if not is_a(value, (types.FunctionType, staticmethod, classmethod, property, type)):
        try:  # patches.datasets.MeasuredInit: read from its __dict__, no code run
            value = object.__getattribute__(value, "__dict__").get("__wrapped__", value)
        except (AttributeError, TypeError):
            return []
    if is_a(value, (staticmethod, classmethod)):
        value = value.__func__
    if is_a(value, property):
        return [f for f in (value.fget, value.fset, value.fdel) if is_a(f, types.FunctionType)]
    return [value] if is_a(value, types.FunctionType) else []


def _defined_in(functions: list[Any], qualname: str) -> bool:
    """Whether these are defined in the class body ``qualname`` (not put there later)."""
    return bool(functions) and all(
        getattr(f, "__qualname__", "").startswith(qualname + ".") for f in functions)


def _one_of(value: Any, *names: tuple[str, str]) -> bool:
    """Whether ``value`` is of a class ``(module, name)`` of the modules already imported."""
    classes = tuple(c for c in (loaded(m, n) for m, n in names) if isinstance(c, type))
    return bool(classes) and is_a(value, classes)


_DATASETS = (("torch.utils.data", "Dataset"), ("torch.utils.data", "Sampler"))
_PAYLOADS = (("torch", "Tensor"), ("numpy", "ndarray"))  # data, never code


def reads_of(parts: Iterable[Any], rebuilt: Iterable[type] = ()) -> tuple[Read, ...]:
    """The ``Read``\\ s of what torch sends a loader's workers (``parts``, ours
    unwrapped by the caller) and of building ``rebuilt`` (the rebuild rung)."""
    walk = _Walk()
    for cls in rebuilt:
        walk.klass(cls)
    for part in parts:
        if part is not None:
            walk.object(part)
    return tuple(walk.found.values())
