"""sitecustomize.py that turns autosafe_torch on for every Python started here.

Copy this file into a directory on sys.path: site-packages, or a folder you
put on PYTHONPATH. Python imports it at start-up; it activates
autosafe_torch (AUTOSAFE_TORCH=0 still switches it off) and then runs the
next ``sitecustomize`` found later on sys.path, so an existing one is kept.
"""

import os
import sys


def _activate():
    try:
        import autosafe_torch  # noqa: F401  (the import activates)
    except BaseException as exc:  # never break interpreter start
        sys.stderr.write("autosafe_torch: sitecustomize could not activate: %r\n" % (exc,))


def _run_next_sitecustomize():
    """Find and execute the sitecustomize that this file shadows, if any."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    later, seen = [], False
    for entry in sys.path:
        if os.path.abspath(entry or os.curdir) == here:
            seen = True
        elif seen:
            later.append(entry)
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", later)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:
        sys.stderr.write("autosafe_torch: the next sitecustomize (%s) failed: %r\n"
                         % (spec.origin, exc))


_activate()
_run_next_sitecustomize()
