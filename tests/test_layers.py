"""Imports run one way: patches -> recovery -> engine -> rules -> remedies ->
inspection -> torch_private, mp_private.

Read from each module's syntax tree (an import inside a function counts too):
a module of a lower layer never imports one of a higher layer, so that the
recovery never reaches back into the patch that starts it, a rule never
reaches back into what calls it. Only ``torch_private`` (and the copy of
torch's loop, ``remedies/emulated_workers.py``) uses torch's private names,
and only ``mp_private`` multiprocessing's, threading's and concurrent.futures'
(each such name outside them fails a test, however it is reached). And no
module imports itself back through others: the package has no import cycle.
"""

import ast
import json
import subprocess
import sys
import textwrap

import pytest

from support import ROOT, clean_env

PACKAGE = ROOT / "autosafe_torch"
LAYERS = ("mp_private", "torch_private", "inspection", "remedies", "rules", "engine", "recovery",
          "patches")


def _layer(parts):
    name = parts[0] if len(parts) > 1 else parts[0].rsplit(".", 1)[0]
    return name if name in LAYERS else None


def _imported(path, node):
    """The package-relative parts each ``from . import`` of ``node`` names."""
    here = list(path.relative_to(PACKAGE).parts[:-1])
    if node.level:
        base = here[:len(here) - (node.level - 1)] if node.level > 1 else here
    elif (node.module or "").startswith("autosafe_torch"):
        base = []
        node = ast.ImportFrom(module=node.module.partition(".")[2], names=node.names, level=1)
    else:
        return []
    module = node.module.split(".") if node.module else []
    if module:
        return [base + module]
    return [base + [alias.name] for alias in node.names]


def test_no_import_runs_back_up():
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        layer = _layer(list(path.relative_to(PACKAGE).parts))
        if layer is None:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ImportFrom):
                continue
            for parts in _imported(path, node):
                target = parts[0] if parts else None
                if target in LAYERS and LAYERS.index(target) > LAYERS.index(layer):
                    upward.append("%s:%d imports %s" % (
                        path.relative_to(ROOT), node.lineno, ".".join(parts)))
    assert not upward, "imports that run back up:\n" + "\n".join(upward)


def _module(parts):
    """``rules.ladder`` for ``["rules", "ladder.py"]``; a package by its ``__init__``."""
    names = list(parts[:-1]) + ([] if parts[-1] == "__init__.py" else [parts[-1][:-3]])
    return ".".join(names)


def _runtime_imports(tree):
    """The ``from`` imports of ``tree`` that run: not those under ``if TYPE_CHECKING``."""
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and "TYPE_CHECKING" in ast.dump(node.test)
                   for stmt in node.body for n in ast.walk(stmt)}
    return [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and id(n) not in typing_only]


def test_no_import_cycle():
    """No module of ours imports itself back through others (a function's
    import counts): each has one place in the stack, not a loop."""
    modules = {_module(p.relative_to(PACKAGE).parts): p for p in PACKAGE.rglob("*.py")}
    graph = {name: set() for name in modules}
    for name, path in modules.items():
        for node in _runtime_imports(ast.parse(path.read_text(), str(path))):
            for parts in _imported(path, node):
                target = ".".join(parts)
                if target in modules:
                    graph[name].add(target)  # a module, or a name of a package's __init__
                elif ".".join(parts[:-1]) in modules:
                    graph[name].add(".".join(parts[:-1]))
        graph[name].discard(name)
    cycles, state = [], {}

    def visit(name, trail):
        state[name] = "open"
        for target in sorted(graph[name]):
            if state.get(target) == "open":
                cycles.append(" -> ".join(trail[trail.index(target):] + [target]))
            elif target not in state:
                visit(target, trail + [target])
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


# The words every layer uses (the rungs, the errors, the settings, what a loader
# keeps): below them all.
VOCABULARY = ("rung", "errors", "config", "loaderstate")


def test_the_vocabulary_imports_no_layer():
    upward = []
    for name in VOCABULARY:
        path = PACKAGE / (name + ".py")
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                for parts in _imported(path, node):
                    if parts and parts[0] not in VOCABULARY:
                        upward.append("%s:%d imports %s" % (name, node.lineno, ".".join(parts)))
    assert not upward, "the vocabulary reaches up:\n" + "\n".join(upward)


# -- a rule imports a remedy to apply it, never to find something ------------------------

# What rules/ may reach in remedies/ (imported from one of its modules, an attribute
# of such a module, or repairs' ``_remedy(module, name)``): what it applies (reducers,
# installs, worker steps and what builds them, what a finding carries or keeps), the
# remedy's own answer to whether it can (it tries its reopen, pickles what it would
# send, reads its own records) and its record's words. A look at the objects or the
# platform (a predicate, a finder) lives in inspection/ (or facts.py), where rule and
# remedy both import it: a name not listed fails, until it moves there or is listed
# with what it applies.
APPLIED = {
    "byvalue": {"by_value", "class_reducers", "register_by_value_class",
                "send_by_value_where_needed"},
    "cv2": {"worker_opencl_off", "worker_threads_off"},
    "handlers": {"handler_reducers"},
    "images": {"image_reducers"},
    # what its workers report; its own plan (it tries each reopen, DL207/DL212)
    "isolation": {"CARRIED", "FORKED", "SERVER", "Usage", "ForkPlan", "plan", "users_parts"},
    "limits": {"file_system_sharing", "raise_soft_limit"},
    "locks": {"lock_reducers"},
    "loggers": {"Reports", "reducers", "uncarried"},  # uncarried: it pickles what it sends
    "mapped_tensors": {"install_reducers"},
    "memmaps": {"install_reducers", "map_reducers", "size_text"},
    "pickling": {"forwarder_reducers", "install"},
    "pools": {"pool_reducers", "rebuild_pools_in_worker"},
    "process_state": {"Carry", "FIX", "REFUSED"},
    "rebuild": {"install", "planned_reducers", "rebuildable_owner"},  # by its own records
    "relocate": {"relocate"},
    "reopen": {"file_reducers", "read_only_note"},  # the note: what its reopening does
    "warmstart": {"exit_with_parent", "libraries_for", "named", "preload", "start_ahead",
                  "warm_context"},
    "workerinit": {"user_function", "with_step", "with_user_function"},
}


def _remedies_reached(path, tree):
    """``(line, module, name)`` for each name of remedies/ that ``tree`` reaches;
    a module of theirs used otherwise than by an attribute: ``name`` None."""
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "_remedy" \
                and all(isinstance(a, ast.Constant) for a in node.args[:2]):
            found.append((node.lineno, node.args[0].value, node.args[1].value))
        if not isinstance(node, ast.ImportFrom):
            continue
        for parts in _imported(path, node):
            if parts[:1] != ["remedies"]:
                continue
            if len(parts) > 1:  # from ..remedies.x import y
                found += [(node.lineno, parts[1], a.name) for a in node.names]
                continue
            scope = node  # from ..remedies import x: x's uses where it is bound
            while scope in parents and not isinstance(scope, ast.FunctionDef):
                scope = parents[scope]
            scope = scope if isinstance(scope, ast.FunctionDef) else tree
            for alias in node.names:
                name = alias.asname or alias.name
                for use in ast.walk(scope):
                    if isinstance(use, ast.Name) and use.id == name \
                            and isinstance(use.ctx, ast.Load):
                        outer = parents[use]
                        attr = outer.attr if isinstance(outer, ast.Attribute) else None
                        found.append((use.lineno, alias.name, attr))
    return found


def _not_applied(reached):
    return [(line, module, name) for line, module, name in reached
            if name not in APPLIED.get(module, ())]


def test_a_rule_imports_a_remedy_to_apply_it():
    found = []
    for path in sorted((PACKAGE / "rules").glob("*.py")):
        for line, module, name in _not_applied(
                _remedies_reached(path, ast.parse(path.read_text(), str(path)))):
            found.append("%s:%d remedies.%s.%s" % (path.relative_to(ROOT), line, module, name))
    assert not found, ("rules reaching a remedy to find something (a look at the objects "
                       "or the platform goes in inspection/), or to apply what APPLIED "
                       "does not list:\n" + "\n".join(found))


FINDING = '''\
from ..remedies import locks
from ..remedies.workerinit import with_step, user_function

def meets(m):
    from ..remedies import images as im
    return locks.unheld_lock(m) and im.reopens(m) and locks.lock_reducers()

MAPS = _remedy("memmaps", "travels", True)

def used(usage, how):
    from ..remedies import isolation
    return getattr(isolation, how)
'''


def test_the_scan_sees_a_rule_find_something_with_a_remedy():
    path = PACKAGE / "rules" / "example.py"
    reached = _remedies_reached(path, ast.parse(FINDING))
    assert sorted(reached) == [
        (2, "workerinit", "user_function"), (2, "workerinit", "with_step"),
        (6, "images", "reopens"), (6, "locks", "lock_reducers"), (6, "locks", "unheld_lock"),
        (8, "memmaps", "travels"), (12, "isolation", None)], reached
    assert sorted(_not_applied(reached)) == [
        (6, "images", "reopens"), (6, "locks", "unheld_lock"), (8, "memmaps", "travels"),
        (12, "isolation", None)]


# -- private names: each library's in its adapter only ------------------------------

# The libraries whose private names (``_y``, one underscore) only an adapter of
# ours uses, and each adapter: a file -> the libraries whose private names it uses.
LIBRARIES = ("torch", "multiprocessing", "threading", "concurrent")
ADAPTERS = {
    "torch_private.py": ("torch",),
    # the copy of torch's loop: one module, which says the torch it mirrors
    "remedies/emulated_workers.py": ("torch",),
    "mp_private.py": ("multiprocessing", "threading", "concurrent"),
}
ADAPTER_OF = {"torch": "torch_private.py", "multiprocessing": "mp_private.py",
              "threading": "mp_private.py", "concurrent": "mp_private.py"}
# Strings of ours that are private names of theirs by chance, each with why.
NOT_THEIRS = {
    "_socket": "the C socket module's name in sys.modules (descriptors.descriptor_of)",
}

# Run in a fresh interpreter: what this one has imported (another test's torch
# modules) would change the names. Every module of the libraries that importing
# them loads: its private names, those of each class it defines (its own and its
# bases' of the same library), what the code of the pure-Python ones reads or
# sets on ``self`` (torch's: its DataLoader's modules; a tensor's and a Module's
# own, made).
LIBRARY_NAMES = textwrap.dedent('''
    import ast, collections, importlib, json, pkgutil, sys, types, warnings
    warnings.simplefilter("ignore")
    import threading
    import torch
    import torch.utils.data
    for package in ("multiprocessing", "concurrent.futures"):
        for info in pkgutil.iter_modules(importlib.import_module(package).__path__):
            try:
                importlib.import_module(package + "." + info.name)
            except ImportError:  # another platform's (popen_spawn_win32)
                pass
    LIBRARIES = %r
    names = {}

    def add(name, library):
        if len(name) > 1 and name[0] == "_" and name[1] != "_":
            names.setdefault(name, set()).add(library)

    def of_library(obj):
        return (getattr(obj, "__module__", None) or "").partition(".")[0] in LIBRARIES

    for module_name, module in sorted(sys.modules.items()):
        library = module_name.partition(".")[0]
        if library not in LIBRARIES or not isinstance(module, types.ModuleType):
            continue
        for name in dir(module):
            add(name, library)
            try:
                value = getattr(module, name)
            except Exception:
                continue
            if isinstance(value, type) and of_library(value):
                for cls in value.__mro__:
                    if of_library(cls):
                        for attr in list(vars(cls)):
                            add(attr, cls.__module__.partition(".")[0])
        path = getattr(module, "__file__", None) or ""
        if path.endswith(".py") and (library != "torch"
                                     or module_name.startswith("torch.utils.data")):
            with open(path, encoding="utf-8") as f:
                for node in ast.walk(ast.parse(f.read())):
                    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \\
                            and node.value.id == "self":
                        add(node.attr, library)
    for obj in (torch.empty(1), torch.nn.Module()):  # torch's others: by their code above
        for name in vars(obj):
            add(name, "torch")
    for name in dir(collections.namedtuple("T", "a")):  # a namedtuple's API (_fields)
        names.pop(name, None)
    print(json.dumps({name: sorted(libraries) for name, libraries in names.items()}))
''' % (LIBRARIES,))


@pytest.fixture(scope="module")
def library_names():
    """``{private name: [the libraries that have it]}``."""
    out = subprocess.run([sys.executable, "-c", LIBRARY_NAMES], capture_output=True, text=True,
                         env=clean_env({"AUTOSAFE_TORCH": "0"}), timeout=120, check=True)
    return {name: set(libraries) for name, libraries in json.loads(out.stdout).items()}


def _private(name):
    return len(name) > 1 and name[0] == "_" and name[1] != "_"


def _root(node):
    while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node


def _adapter_modules():
    return {name[:-3].replace("/", ".") for name in ADAPTERS}


def _bindings(path, tree):
    """The names ``tree`` binds by importing: ``{name: library}`` for torch's and
    the stdlib's (a module, or a name from one); those from an adapter of ours
    (their classes are the library's); the rest (our modules, ``os``, ``sys``)."""
    libraries, adapted, other = {}, set(), set()
    adapters = _adapter_modules()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                name = alias.asname or top
                if top in LIBRARIES:
                    libraries[name] = top
                else:
                    other.add(name)
        elif isinstance(node, ast.ImportFrom):
            top = (node.module or "").split(".")[0]
            if node.level == 0 and top in LIBRARIES:
                libraries.update((alias.asname or alias.name, top) for alias in node.names)
                continue
            modules = _imported(path, node)  # ours; none for another package's
            for i, alias in enumerate(node.names):
                if not modules:
                    other.add(alias.asname or alias.name)
                    continue
                parts = modules[0] if node.module else modules[i]
                name = alias.asname or alias.name
                from_adapter = {".".join(parts), ".".join(parts + [alias.name])} & adapters
                (adapted if from_adapter else other).add(name)
    return libraries, adapted, other


def _derived(cls, libraries, adapted):
    """Whether class ``cls`` derives from a library's class (or an adapter's)."""
    roots = [_root(base) for base in cls.bases]
    return any(isinstance(r, ast.Name) and (r.id in libraries or r.id in adapted) for r in roots)


def _defined(stmt):
    """The names a statement of a module or class body defines."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {stmt.name}
    targets = stmt.targets if isinstance(stmt, ast.Assign) else \
        [stmt.target] if isinstance(stmt, (ast.AnnAssign, ast.AugAssign)) else []
    names = {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    if "__slots__" in names and isinstance(stmt, ast.Assign):
        names |= {n.value for n in ast.walk(stmt.value) if isinstance(n, ast.Constant)}
    return names


def _our_names(trees):
    """The names our code gives its own objects: a module's or class's (but a
    class's that derives from a library's), and what methods set on ``self``."""
    ours = set()
    for path, tree in trees.items():
        libraries, adapted, _ = _bindings(path, tree)
        for stmt in tree.body:
            ours |= _defined(stmt)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and not _derived(node, libraries, adapted):
                for stmt in node.body:
                    ours |= _defined(stmt)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, (ast.Store, ast.Del)) \
                    and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                ours.add(node.attr)
            elif _sets_on_self(node):  # object.__setattr__(self, "_name", value)
                ours.add(node.args[1].value)
    return ours


def _sets_on_self(node):
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
        and node.func.attr == "__setattr__" and getattr(node.func.value, "id", None) == "object" \
        and len(node.args) == 3 and getattr(node.args[0], "id", None) == "self" \
        and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)


BY_NAME = ("getattr", "hasattr", "setattr", "delattr")


class _Uses(ast.NodeVisitor):
    """Each private name of the libraries one file of ours uses, but those of
    the libraries it is the adapter of: reached through an import of theirs
    (``mp.process.current_process()._inheriting``), through any other value
    (``lock._semlock``, ``getattr(pool, "_state")``), through ``self`` in a
    class of ours that derives from theirs (or names none of our code gives its
    objects), overridden in such a class, imported, or written as a string."""

    def __init__(self, path, tree, names, ours, allowed):
        self.names, self.ours, self.allowed = names, ours, allowed
        self.libraries, self.adapted, self.other = _bindings(path, tree)
        self.classes = [(False, set())]  # the class read: derived, the names it gives
        self.said = set()  # the strings read as a name asked for (getattr)
        self.found = []
        self.visit(tree)

    def _found(self, line, name, how, libraries=None):
        libraries = libraries or self.names.get(name, set())
        if libraries and not set(libraries) & set(self.allowed):
            self.found.append((line, name, sorted(libraries), how))

    def _reached(self, value, name, line, how):
        if isinstance(value, ast.Name) and value.id in ("self", "cls") or \
                isinstance(value, ast.Call) and getattr(value.func, "id", None) == "super":
            derived, its_own = self.classes[-1]
            if name in self.names and (derived or name not in self.ours | its_own):
                self._found(line, name, how)
            return
        root = _root(value)
        if isinstance(root, ast.Name) and root.id in self.libraries:
            self._found(line, name, how, [self.libraries[root.id]])
        elif not (isinstance(root, ast.Name) and root.id in self.adapted | self.other):
            self._found(line, name, how)  # a value: whatever it holds

    def visit_ClassDef(self, node):
        derived = _derived(node, self.libraries, self.adapted)
        if derived:
            for stmt in node.body:
                for name in sorted(_defined(stmt)):
                    if _private(name):
                        self._found(stmt.lineno, name, "%s overridden" % name)
        its_own = set().union(*(_defined(stmt) for stmt in node.body)) | {
            n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)
            and isinstance(n.ctx, (ast.Store, ast.Del)) and getattr(n.value, "id", None) == "self"}
        self.classes.append((derived, its_own))
        self.generic_visit(node)
        self.classes.pop()

    def visit_Attribute(self, node):
        if _private(node.attr):
            self._reached(node.value, node.attr, node.lineno, "." + node.attr)
        self.generic_visit(node)

    def visit_Call(self, node):
        if isinstance(node.func, ast.Name) and node.func.id in BY_NAME and len(node.args) >= 2 \
                and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str) \
                and _private(node.args[1].value):
            self.said.add(id(node.args[1]))
            self._reached(node.args[0], node.args[1].value, node.lineno,
                          "%s(..., %r)" % (node.func.id, node.args[1].value))
        self.generic_visit(node)

    def visit_Constant(self, node):
        if isinstance(node.value, str) and _private(node.value) and id(node) not in self.said \
                and node.value not in self.ours | set(NOT_THEIRS):
            self._found(node.lineno, node.value, repr(node.value))

    def visit_JoinedStr(self, node):
        pass  # an f-string's text is words

    def visit_Expr(self, node):
        if not (isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
            self.generic_visit(node)  # a bare string (a docstring) is words

    def visit_Import(self, node):
        for alias in node.names:
            parts = alias.name.split(".")
            if parts[0] in LIBRARIES and any(_private(part) for part in parts):
                self._found(node.lineno, alias.name, "import " + alias.name, [parts[0]])

    def visit_ImportFrom(self, node):
        parts = (node.module or "").split(".")
        if node.level == 0 and parts[0] in LIBRARIES:
            for name in parts + [alias.name for alias in node.names]:
                if _private(name):
                    self._found(node.lineno, name, "from %s import" % node.module, [parts[0]])


def _private_uses(path, tree, names, ours, allowed=()):
    """``(line, name, libraries, how)`` for each use :class:`_Uses` finds."""
    return _Uses(path, tree, names, ours, allowed).found


def test_only_the_adapters_touch_private_names_of_torch_and_multiprocessing(library_names):
    """A private name of torch's, multiprocessing's, threading's or
    concurrent.futures' (any module or class of theirs, what their code sets
    on its objects, what their common objects hold) is used in its adapter
    only, however it is reached: outside them, a name that our own code gives
    its objects is ours only on ``self`` in a class of ours (not one that
    derives from theirs), or as a string."""
    trees = {path: ast.parse(path.read_text(), str(path)) for path in sorted(PACKAGE.rglob("*.py"))}
    adapters = {PACKAGE / name for name in ADAPTERS}
    ours = _our_names({p: t for p, t in trees.items() if p not in adapters})
    outside = []
    for path, tree in trees.items():
        allowed = ADAPTERS.get(path.relative_to(PACKAGE).as_posix(), ())
        for line, _name, libraries, how in _private_uses(path, tree, library_names, ours, allowed):
            outside.append("%s:%d %s (%s's: %s)" % (path.relative_to(ROOT), line, how,
                                                    "/".join(libraries), ADAPTER_OF[libraries[0]]))
    assert not outside, "private names outside their adapter:\n" + "\n".join(outside)


def test_the_library_names_are_read_from_the_libraries(library_names):
    """Their modules' and classes' names, what their code sets on ``self``, what
    their objects hold; a namedtuple's API (``_fields``) is public."""
    for name, library in (("_semlock", "multiprocessing"), ("_processes", "multiprocessing"),
                          ("_pool", "multiprocessing"), ("_state", "multiprocessing"),
                          ("_launch", "multiprocessing"), ("_Popen", "multiprocessing"),
                          ("_target", "multiprocessing"), ("_target", "threading"),
                          ("_PyRLock", "threading"), ("_is_owned", "threading"),
                          ("_max_workers", "concurrent"), ("_threads", "concurrent"),
                          ("_cdata", "torch"), ("_backward_hooks", "torch"),
                          ("_base_seed", "torch"), ("_index_sampler", "torch"),
                          ("_get_iterator", "torch"), ("_worker_loop", "torch"),
                          ("_parameters", "torch")):  # a Module's, made
        assert library in library_names.get(name, ()), (name, library)
    assert "_fields" not in library_names and "_asdict" not in library_names


EXAMPLE = '''\
import multiprocessing as mp
import os
import threading
from multiprocessing.reduction import ForkingPickler
from torch._utils import ExceptionWrapper
from .. import torch_private as tp
from ..config import CONFIG

ForkingPickler._extra_reducers
mp.process.current_process()._inheriting
threading._PyRLock
os._exit(0)
CONFIG._validated
tp._once


def semlock(lock, pool, t):
    lock._semlock.name
    getattr(pool, "_state", None)
    hasattr(t, "_backward_hooks")
    t.untyped_storage()._cdata
    for name in ("_cond", "_mine"):
        pass
    f"_cond {name}"
    return lock._mine


class Ours:
    _mine = 1

    def run(self):
        """_cond in words"""
        return self._mine, self._target, super()._mine


class Theirs(mp.Process):
    _start_method = "forkserver"

    def _Popen(self):
        return self._target, self._mine


class Through(tp.BaseIter):
    def _reset(self):
        return self._base_seed
'''


def test_the_scan_sees_a_private_name_where_one_is_used():
    """The scan above, on code that breaks the rule in each way it reads (and
    on names it leaves alone: another module's, ours)."""
    names = {n: {"torch"} for n in ("_extra_reducers", "_inheriting", "_PyRLock", "_exit",
                                     "_validated", "_once", "_semlock", "_state",
                                     "_backward_hooks", "_cdata", "_cond", "_mine", "_target",
                                     "_start_method", "_Popen", "_reset", "_base_seed", "_utils")}
    path = PACKAGE / "remedies" / "example.py"
    tree = ast.parse(EXAMPLE)
    found = [(line, how) for line, _name, _libraries, how
             in _private_uses(path, tree, names, _our_names({path: tree}))]
    assert found == [
        (5, "from torch._utils import"), (9, "._extra_reducers"), (10, "._inheriting"),
        (11, "._PyRLock"), (18, "._semlock"), (19, "getattr(..., '_state')"),
        (20, "hasattr(..., '_backward_hooks')"), (21, "._cdata"), (22, "'_cond'"),
        (25, "._mine"), (33, "._target"), (37, "_start_method overridden"),
        (39, "_Popen overridden"), (40, "._target"), (40, "._mine"), (44, "_reset overridden"),
        (45, "._base_seed")], found
    in_torchs_adapter = _private_uses(path, tree, names, _our_names({path: tree}), ("torch",))
    assert [how for _line, _name, _libraries, how in in_torchs_adapter] == [
        "._extra_reducers", "._inheriting", "._PyRLock"]  # the others' names still fail
