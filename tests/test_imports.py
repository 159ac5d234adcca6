"""Every import of our package resolves, the ones inside functions included.

The package imports most of its own modules inside functions (to keep
``import torch`` cheap and to break cycles): a name that moves or is renamed
breaks only when that line runs, and the shim, failing open, turns the
ImportError into "the original call ran unchanged" (CV402 did so for every
loader it should have fixed). ruff (``make test``) sees undefined names,
not whether ``from .workers import x`` still finds ``x``; this does, from the
syntax trees of the package and of the tests, without running any function.
"""

import ast
import json
import subprocess
import sys
import textwrap

from support import ROOT, clean_env

PACKAGE = "autosafe_torch"

# Run in a fresh interpreter: importing every module of the package here would
# leave them (and what they import) in this pytest worker.
RESOLVE = textwrap.dedent('''
    import importlib, json, sys
    bad = []
    for where, target, names in json.loads(sys.stdin.read()):
        try:
            module = importlib.import_module(target)
        except Exception as exc:
            bad.append("%s: cannot import %s (%s: %s)" % (where, target, type(exc).__name__, exc))
            continue
        for name in names:
            if hasattr(module, name):
                continue
            try:
                importlib.import_module("%s.%s" % (target, name))
            except Exception:
                bad.append("%s: %s has no %s" % (where, target, name))
    print(json.dumps(bad))
''')


def module_name(path, root):
    """``autosafe_torch/rules/cv2.py`` -> ("autosafe_torch.rules.cv2", its package)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
        return ".".join(parts), ".".join(parts)
    return ".".join(parts), ".".join(parts[:-1])


def imports_of(path, root, package=PACKAGE):
    """The imports of our package in the file at ``path`` (module level or not), as
    (where, module, names): relative ones resolved against the file's package;
    ``import autosafe_torch.x`` as (where, "autosafe_torch.x", [])."""
    _, base = module_name(path, root) if path.is_relative_to(root / package) else (None, None)
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found = []
    for node in ast.walk(tree):
        where = "%s:%d" % (path.relative_to(root), getattr(node, "lineno", 0))
        if isinstance(node, ast.ImportFrom):
            if node.level:
                if base is None:
                    continue  # a test's own relative import: none today
                parts = base.split(".")
                parts = parts[:len(parts) - (node.level - 1)]
                target = ".".join(parts + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == package or target.startswith(package + "."):
                found.append((where, target, [a.name for a in node.names if a.name != "*"]))
        elif isinstance(node, ast.Import):
            found += [(where, a.name, []) for a in node.names
                      if a.name == package or a.name.startswith(package + ".")]
    return found


def unresolved(imports, cwd=ROOT):
    out = subprocess.run([sys.executable, "-c", RESOLVE], input=json.dumps(imports),
                         capture_output=True, text=True, timeout=300, cwd=str(cwd),
                         env=clean_env({"AUTOSAFE_TORCH": "0"}))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def our_files():
    return sorted((ROOT / PACKAGE).rglob("*.py")) + sorted((ROOT / "tests").glob("*.py"))


def test_every_import_of_our_package_resolves():
    imports = [i for path in our_files() for i in imports_of(path, ROOT)]
    inside = sum(1 for path in our_files() for node in ast.walk(ast.parse(path.read_text()))
                 if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                 for inner in ast.walk(node) if isinstance(inner, ast.ImportFrom))
    assert inside > 100  # the walk reaches into functions
    assert unresolved(imports) == []


def test_a_name_that_moved_is_found(tmp_path):
    """The check itself: a function importing a name its sibling no longer has."""
    pkg = tmp_path / PACKAGE
    (pkg / "rules").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "rules" / "__init__.py").write_text("def emulated_workers():\n    pass\n")
    (pkg / "rules" / "workers.py").write_text("def pickling_plan():\n    pass\n")
    (pkg / "rules" / "cv2.py").write_text(textwrap.dedent('''
        def away():
            from .workers import _emulated, pickling_plan
            from . import emulated_workers
            from ..rules import nowhere
    '''))
    imports = imports_of(pkg / "rules" / "cv2.py", tmp_path)
    assert [(t, n) for _, t, n in imports] == [
        ("autosafe_torch.rules.workers", ["_emulated", "pickling_plan"]),
        ("autosafe_torch.rules", ["emulated_workers"]), ("autosafe_torch.rules", ["nowhere"])]
    bad = unresolved(imports, cwd=tmp_path)  # the package of tmp_path, first on sys.path
    assert bad == ["autosafe_torch/rules/cv2.py:3: autosafe_torch.rules.workers has no _emulated",
                   "autosafe_torch/rules/cv2.py:5: autosafe_torch.rules has no nowhere"], bad


# A program that imports one of our modules that loads torch_private (the
# recovery, say) before torch: torch_private's own `import torch` runs our patch
# hook, whose patches read torch_private, then only partly loaded. Without the
# wait (patches.apply_for), each patch failed open ("internal error in patching
# autosafe_torch.patches.dataloader (ImportError: cannot import name ...)") and
# the shim did nothing for any loader.
BEFORE_TORCH = textwrap.dedent('''
    import autosafe_torch.recovery
    import torch
    from torch.utils.data import DataLoader
    from autosafe_torch import patches
    print(sorted(patches._applied))
    DataLoader(list(range(4)), batch_size=2, num_workers=0, prefetch_factor=2)  # DL101
    print("built")
''')


def test_our_modules_imported_before_torch_still_patch_it(tmp_path):
    result = subprocess.run([sys.executable, "-c", BEFORE_TORCH], cwd=str(tmp_path),
                            env=clean_env({"AUTOSAFE_TORCH": "1"}), capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "internal error" not in result.stderr, result.stderr
    assert "'autosafe_torch.patches.dataloader'" in result.stdout, result.stdout
    assert "built" in result.stdout and "DL101" in result.stderr, result.stderr
