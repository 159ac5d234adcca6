"""The ``__main__`` module, as a spawn/forkserver child will see it.

A spawned child re-creates the parent's main module as ``__mp_main__``, by
``__spec__.name`` (``python -m``) or by running its file with ``__name__ !=
"__main__"``. So, read from the source with one parser of the guard: what
the script defines under it (or at all, for ``python -c``, stdin, a
notebook) is missing in the child (``missing_in_child``); top-level code
outside it runs again in every child, which raises "An attempt has been
made to start a new process before the current process has finished its
bootstrapping phase" where it starts workers (``main_is_guarded``).
"""

import ast
import functools
import os
import sys


def interactive_main():
    """True when a spawned child cannot re-import the main module (``python -c``,
    stdin, a REPL, a notebook: no ``__spec__.name``, no file)."""
    main = sys.modules.get("__main__")
    if main is None:
        return True
    spec = getattr(main, "__spec__", None)
    if spec is not None and getattr(spec, "name", None):
        return False
    path = getattr(main, "__file__", None)
    if not isinstance(path, str) or not os.path.isfile(path):
        return True
    return os.path.splitext(os.path.basename(path))[0] == "ipython"


def in_notebook():
    """True in a Jupyter kernel, whose cells are a main module no worker can import."""
    zmqshell = sys.modules.get("ipykernel.zmqshell")
    ipython = sys.modules.get("IPython")
    try:  # either may be missing (None)
        return isinstance(ipython.get_ipython(), zmqshell.ZMQInteractiveShell)
    except Exception:
        return False


def is_main_guard(test):
    """``__name__ == "__main__"`` (either way round)."""
    if not isinstance(test, ast.Compare) or len(test.comparators) != 1 \
            or not isinstance(test.ops[0], ast.Eq):
        return False
    sides = (test.left, test.comparators[0])
    return any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides) and \
        any(isinstance(s, ast.Constant) and s.value == "__main__" for s in sides)


@functools.lru_cache(maxsize=8)
def _parse(path, _mtime):
    try:
        with open(path, "rb") as f:
            return ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError):
        return None


def _script_tree(path):
    try:
        return _parse(path, os.stat(path).st_mtime_ns)
    except (OSError, TypeError):
        return None


@functools.lru_cache(maxsize=8)
def _guarded_lines(tree):
    return frozenset(line for node in tree.body
                     if isinstance(node, ast.If) and is_main_guard(node.test)
                     for inner in node.body
                     for line in range(inner.lineno, (inner.end_lineno or inner.lineno) + 1))


def guarded_lines(path):
    """Line numbers of ``path`` inside a top-level ``if __name__ == "__main__":``."""
    tree = _script_tree(path)
    return frozenset() if tree is None else _guarded_lines(tree)


def main_is_guarded(frame):
    """False when a top-level frame of a __main__ script is on the stack outside
    the guard (spawn would re-run it), or __main__ names a missing file (a
    script from stdin: children fail to run '<stdin>')."""
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    if main_file and not os.path.isfile(main_file):
        return False
    while frame is not None:
        g = frame.f_globals
        if frame.f_code.co_name == "<module>" and g.get("__name__") == "__main__":
            path = g.get("__file__")
            if path and os.path.isfile(path):
                return frame.f_lineno in guarded_lines(path)
            return True
        frame = frame.f_back
    return True


@functools.lru_cache(maxsize=8)
def _names_bound_in_child(tree):
    """Top-level names a child binds running the script as ``__mp_main__``; None
    where that cannot be told (a star import): assume all."""
    names = set()

    def visit(body):
        for node in body:
            if isinstance(node, ast.If) and is_main_guard(node.test):
                visit(node.orelse)
                continue
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
                continue
            for sub in ast.walk(node):
                if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                    names.add(sub.id)
                elif isinstance(sub, (ast.Import, ast.ImportFrom)):
                    for alias in sub.names:
                        if alias.name == "*":
                            raise LookupError
                        names.add(alias.asname or alias.name.split(".")[0])
                elif isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    names.add(sub.name)
                elif isinstance(sub, ast.Global):
                    names.update(sub.names)

    try:
        visit(tree.body)
    except LookupError:
        return None
    return frozenset(names)


# How the child's built-in __main__ reads in pickle's error (Python 3.13 names its loader).
_CHILD_MAIN = "<module '__main__' (%s)>" % (
    "built-in" if sys.version_info < (3, 13) else "<class '_frozen_importlib.BuiltinImporter'>")


def missing_in_child(obj):
    """The child's error text if ``obj`` (a class or function of ``__main__``) is absent there."""
    qualname = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    if not isinstance(qualname, str) or "<locals>" in qualname or "<lambda>" in qualname:
        return None  # the parent's own pickle error says it better
    if interactive_main():
        return "Can't get attribute %r on %s" % (qualname, _CHILD_MAIN)
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    tree = _script_tree(path)
    names = None if tree is None else _names_bound_in_child(tree)
    if names is None or qualname.split(".")[0] in names:
        return None
    return "Can't get attribute %r on <module '__mp_main__' from %r>" % (qualname, path)


def importable_by_reference(obj):
    """Whether pickle saves ``obj`` (a function or class) by reference and a
    spawned worker finds it by its qualified name (not a lambda, a local one,
    or one under the ``__main__`` guard)."""
    qualname = getattr(obj, "__qualname__", None)
    module = sys.modules.get(getattr(obj, "__module__", None) or "")
    if not isinstance(qualname, str) or "<locals>" in qualname or "<lambda>" in qualname \
            or module is None:
        return False
    target = module
    for part in qualname.split("."):
        target = getattr(target, part, None)
    return target is obj and (module.__name__ != "__main__" or missing_in_child(obj) is None)
