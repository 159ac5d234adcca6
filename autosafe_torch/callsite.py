"""The user's file:line for a call that reached one of our wrappers."""

import os
import sys

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def _library_dirs():
    dirs = [_PACKAGE_DIR]
    for name in ("torch", "wrapt"):
        module = sys.modules.get(name)
        path = getattr(module, "__file__", None)
        if path:
            dirs.append(os.path.dirname(os.path.abspath(path)))
    return tuple(d + os.sep for d in dirs)


_skip = None


def user_call_site(instance=None):
    """file:line of the nearest frame outside autosafe_torch, torch and wrapt.

    Frames of ``instance``'s own methods (a DataLoader subclass's __init__
    calling super) are skipped too: the site is where the object was made.
    """
    global _skip
    if _skip is None:
        _skip = _library_dirs()
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not (filename.startswith(_skip) or filename.startswith("<frozen")
                or (instance is not None and frame.f_locals.get("self") is instance)):
            return "%s:%d" % (filename, frame.f_lineno)
        frame = frame.f_back
    return "<unknown>"
