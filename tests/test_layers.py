"""Imports run one way: patches -> recovery -> engine -> rules -> remedies ->
inspection -> torch_private, mp_private.

Read from each module's syntax tree (an import inside a function counts too):
a module of a lower layer never imports one of a higher layer, so that the
recovery never reaches back into the patch that starts it, a rule never
reaches back into what calls it. Only ``torch_private`` touches torch's
private DataLoader internals, and only ``mp_private`` multiprocessing's (each
private name outside them fails a test). And no module imports itself back
through others: the package has no import cycle.
"""

import ast
import inspect

import torch.utils.data.dataloader as torch_dataloader

from autosafe_torch import torch_private
from support import ROOT

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


# -- private names: each library's in its adapter only ------------------------------

ADAPTERS = {"torch": "torch_private.py", "multiprocessing": "mp_private.py"}


def _bound_to_libraries(tree):
    """``{name: library}`` for the names ``tree`` binds by importing torch or
    multiprocessing (a module, or a name from one)."""
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                if top in ADAPTERS:
                    bound[alias.asname or top] = top
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            top = node.module.split(".")[0]
            if top in ADAPTERS:
                for alias in node.names:
                    bound[alias.asname or alias.name] = top
    return bound


def _root(node):
    while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node


def _private(name):
    return name.startswith("_") and not name.startswith("__")


def _torch_base_names():
    """The private names of torch's ``_BaseDataLoaderIter`` (what its methods
    set on ``self``, and the methods themselves) and of ``DataLoader``'s."""
    names = set()
    for cls in (torch_dataloader._BaseDataLoaderIter, torch_dataloader.DataLoader):
        tree = ast.parse(inspect.getsource(cls).lstrip())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id == "self" and _private(node.attr):
                names.add(node.attr)
            elif isinstance(node, ast.FunctionDef) and _private(node.name):
                names.add(node.name)
    return names


def test_only_the_adapters_touch_private_names_of_torch_and_multiprocessing():
    """A private name reached from a torch or multiprocessing import (``X._y``
    where ``X`` came from ``import multiprocessing``...) is used in its adapter
    only; so is a private name of torch's base iterator or DataLoader, but
    those the adapter declares for the emulated workers (a port of torch's
    loop onto that base, read by ``emulated_missing`` on every torch)."""
    declared = set(torch_private.EMULATED_ATTRIBUTES) | set(torch_private.EMULATED_METHODS)
    torch_names = _torch_base_names() - declared
    outside = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name in ADAPTERS.values() and path.parent == PACKAGE:
            continue
        tree = ast.parse(path.read_text(), str(path))
        bound = _bound_to_libraries(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or not _private(node.attr):
                continue
            root = _root(node.value)
            library = bound.get(root.id) if isinstance(root, ast.Name) else None
            if library is None and node.attr in torch_names:
                library = "torch"
            if library is not None:
                outside.append("%s:%d %s (%s's: %s)" % (
                    path.relative_to(ROOT), node.lineno, node.attr, library, ADAPTERS[library]))
    assert not outside, "private names outside their adapter:\n" + "\n".join(outside)


def test_the_scan_sees_a_private_name_where_one_is_used(tmp_path):
    """The scan above, on code that breaks the rule in each way it reads."""
    tree = ast.parse("from multiprocessing.reduction import ForkingPickler\n"
                     "import multiprocessing as mp\n"
                     "ForkingPickler._extra_reducers\n"
                     "mp.process.current_process()._inheriting\n")
    bound = _bound_to_libraries(tree)
    found = [node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
             and _private(node.attr) and isinstance(_root(node.value), ast.Name)
             and _root(node.value).id in bound]
    assert sorted(found) == ["_extra_reducers", "_inheriting"]
    assert {"_base_seed", "_index_sampler", "_get_iterator"} <= _torch_base_names()
