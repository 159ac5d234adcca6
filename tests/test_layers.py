"""Imports run one way: patches -> recovery -> engine -> rules -> remedies ->
inspection -> torch_private.

Read from each module's syntax tree (an import inside a function counts too):
a module of a lower layer never imports one of a higher layer, so that the
recovery never reaches back into the patch that starts it, a rule never
reaches back into what calls it, and only ``torch_private`` touches torch's
private DataLoader internals. And no module imports itself back through
others: the package has no import cycle.
"""

import ast

from support import ROOT

PACKAGE = ROOT / "autosafe_torch"
LAYERS = ("torch_private", "inspection", "remedies", "rules", "engine", "recovery", "patches")


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
