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


_sites = {}  # (caller code, line, its caller's code, line) -> "file:line"
_SITES_LIMIT = 4096


def cached_call_site(instance=None):
    """``user_call_site`` cached by the first two frames outside the libraries.

    autocast is built every step from the same line: walking the stack by
    file name is cheap, reading a frame's locals (which ``user_call_site``
    does to skip a subclass's own ``__init__``) is not.
    """
    global _skip
    if _skip is None:
        _skip = _library_dirs()
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_skip + ("<frozen",)):
        frame = frame.f_back
    if frame is None:
        return user_call_site(instance)
    back = frame.f_back
    key = (frame.f_code, frame.f_lineno,
           back.f_code if back is not None else None, back.f_lineno if back is not None else 0)
    site = _sites.get(key)
    if site is None:
        site = user_call_site(instance)
        if len(_sites) < _SITES_LIMIT:
            _sites[key] = site
    return site
