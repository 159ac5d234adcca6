"""Post-import hooks without importing anything heavy at start-up.

A tiny ``sys.meta_path`` finder watches a few top-level names (torch, cv2):
it lets the normal finders find the module and wraps its loader, so that the
callback runs once the module has executed (not wrapt's importer: ``import
wrapt`` alone costs every process about 20 ms). opencv's ``cv2/__init__.py``
re-imports its native module as ``cv2`` while it executes: the callback runs
once, after the outermost import, with what ``sys.modules`` holds then. A
callback that raises never breaks the user's import: ``on_error`` gets it.
"""

import contextlib
import sys


class _HookedLoader:
    """Delegates to the real loader; runs the hook after ``exec_module``."""

    def __init__(self, loader, finder, name):
        self._loader, self._finder, self._name = loader, finder, name

    def __getattr__(self, attr):  # create_module and the rest
        return getattr(self._loader, attr)

    def exec_module(self, module):
        # Keep the real loader visible to code that inspects the module.
        with contextlib.suppress(Exception):
            module.__loader__ = self._loader
            if module.__spec__ is not None:
                module.__spec__.loader = self._loader
        finder = self._finder
        finder.depth[self._name] = finder.depth.get(self._name, 0) + 1
        try:
            self._loader.exec_module(module)
        finally:
            finder.depth[self._name] -= 1
        if finder.depth[self._name] == 0:
            finder.fire(self._name)


class PostImportFinder:
    """Installed at once: ``on_import(name, module)`` runs after each of
    ``names`` is imported (at once for one already imported)."""

    def __init__(self, names, on_import, on_error):
        self.names = frozenset(names)
        self.depth = {}
        self._searching = set()
        self._on_import, self._on_error = on_import, on_error
        sys.meta_path.insert(0, self)
        for name in names:
            self.fire(name)

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.names or fullname in self._searching:
            return None
        import importlib.util

        self._searching.add(fullname)
        try:
            spec = importlib.util.find_spec(fullname)
        except Exception:
            return None
        finally:
            self._searching.discard(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        spec.loader = _HookedLoader(spec.loader, self, fullname)
        return spec

    def fire(self, name):
        module = sys.modules.get(name)
        if module is None:
            return
        try:
            self._on_import(name, module)
        except Exception as exc:  # never into the user's import
            with contextlib.suppress(Exception):
                self._on_error("import hook for %s" % name, exc)

    def uninstall(self):
        while self in sys.meta_path:
            sys.meta_path.remove(self)
