"""Post-import hooks without importing anything heavy at start-up.

A tiny ``sys.meta_path`` finder watches for a few top-level names (torch,
cv2). When one is imported, it lets the normal finders find the module,
wraps the loader so that the callbacks run once the module has executed,
and runs them with the module from ``sys.modules``. We do not use wrapt's
importer here because ``import wrapt`` alone costs about 20 ms, which every
process would pay.

opencv's ``cv2/__init__.py`` re-imports its native module under the name
``cv2`` while it executes: the callbacks run once, after the outermost
import of the name has finished, with what ``sys.modules`` holds then.

A callback that raises never breaks the user's import: the error is handed
to ``on_error`` and the import goes on.
"""

import contextlib
import sys


class _HookedLoader:
    """Delegates to the real loader; runs the hooks after ``exec_module``."""

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
    def __init__(self, on_error):
        self.hooks = {}
        self.depth = {}
        self._searching = set()
        self._on_error = on_error

    def register(self, name, callback):
        """Run ``callback(module)`` after ``name`` is imported (now if it is)."""
        self.hooks.setdefault(name, []).append(callback)
        module = sys.modules.get(name)
        if module is not None and not self.depth.get(name):
            self._call(callback, module, name)

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.hooks or fullname in self._searching:
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
        for callback in list(self.hooks.get(name, ())):
            self._call(callback, module, name)

    def _call(self, callback, module, name):
        try:
            callback(module)
        except Exception as exc:  # never into the user's import
            with contextlib.suppress(Exception):
                self._on_error("import hook for %s" % name, exc)

    def install(self):
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)

    def uninstall(self):
        while self in sys.meta_path:
            sys.meta_path.remove(self)
