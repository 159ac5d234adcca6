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
