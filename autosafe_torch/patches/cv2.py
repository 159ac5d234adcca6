"""``import cv2``: remedies/cv2.py's fork hook is registered, silently, once
the outermost ``import cv2`` has finished (opencv's ``cv2/__init__.py``
re-imports its native module under the name cv2 while it runs).

``cv2.VideoCapture``'s own ``__init__`` and ``open`` are wrapped to record
what each capture opened, so that a worker can open the same video again
(remedies/reopen.py): a capture neither pickles nor survives fork. The class
stays the class (a subclass crashes opencv-python 5.0 at interpreter exit),
and its instances take neither attributes nor weak references: the records
are kept by id (``holdings.remember_video_source``). Whatever goes wrong
here is logged and never reaches ``import cv2``.
"""

import os

from .. import report
from ..inspection import holdings
from ..remedies import cv2 as cv2_remedies
from . import unwrap, wrap, wrapped

_state = {"patched": None}


def _recording(wrapped, instance, args, kwargs):
    """``VideoCapture.__init__`` and ``open``: the native call, then its record,
    ``(absolute path or index, apiPreference, params)``."""
    result = wrapped(*args, **kwargs)
    bound = dict(zip(("source", "apiPreference", "params"), args))
    for key, value in kwargs.items():
        bound["source" if key in ("filename", "index") else key] = value
    source = bound.get("source")
    if isinstance(source, (str, bytes, os.PathLike)):
        source = os.path.abspath(os.fsdecode(source))
    elif not isinstance(source, int):
        source = None  # a data stream, or nothing opened yet: not reopened
    params = tuple(int(p) for p in bound.get("params") or ())
    holdings.remember_video_source(instance,
                                   (source, int(bound.get("apiPreference", 0)), params))
    return result


def _capture_class(cv2):
    cls = getattr(cv2, "VideoCapture", None)
    return cls if isinstance(cls, type) else None


def record_captures(cv2):
    cls = _capture_class(cv2)
    if cls is None:
        return
    try:
        for name in ("__init__", "open"):
            wrap(cls, name, _recording)
    except Exception:
        unrecord_captures(cv2)  # both or neither
        raise


def unrecord_captures(cv2):
    cls = _capture_class(cv2)
    if cls is not None:
        for name in ("__init__", "open"):
            unwrap(cls, name)


def capture_recorded(cv2):
    cls = _capture_class(cv2)
    return cls is not None and wrapped(cls, "__init__")


def patch(cv2):
    if _state["patched"] is cv2:
        return
    _state["patched"] = cv2
    for what, step in (("recording cv2.VideoCapture", lambda: record_captures(cv2)),
                       ("registering the cv2 fork hook", cv2_remedies.install_fork_hook)):
        try:
            step()
        except Exception as exc:
            report.internal_error(what, exc)


def unpatch():
    if _state["patched"] is not None:
        unrecord_captures(_state["patched"])
    _state["patched"] = None
