"""``import cv2``: threads and OpenCL off in this process and its children.

Applied by the import hook once the outermost ``import cv2`` has finished
(opencv's ``cv2/__init__.py`` re-imports its native module under the name
cv2 while it runs; the hook fires once, with the package that
``sys.modules`` holds afterwards). Nothing is wrapped: the checks at
``cv2.import`` (rules/cv2.py) decide, the engine applies.

Whatever goes wrong here is logged and never reaches ``import cv2``.
"""

import os

from .. import engine
from ..rules import Context

_state = {"patched": None}


def import_site():
    """file:line of the ``import cv2`` that triggered us, or "<import cv2>"."""
    from ..callsite import user_call_site

    site = user_call_site()
    return "<import cv2>" if site == "<unknown>" else site


def findings(cv2, environ=None):
    """CV401 and CV402 for this process, as the rules see them now."""
    ctx = Context(None, cv2=cv2, environ=os.environ if environ is None else environ)
    return engine.run_checks("cv2.import", {}, ctx)[0]


def patch(cv2):
    if _state["patched"] is cv2:
        return
    _state["patched"] = cv2
    try:
        found = findings(cv2)
        if found:
            engine.settle(found, import_site())
    except engine.UnsafeCallError as exc:
        # Strict mode: said as an error, but an import is never broken.
        import logging

        from ..report import log

        log(logging.ERROR, "%s", exc)
    except Exception as exc:
        from ..report import internal_error

        internal_error("patching cv2", exc)


def unpatch():
    _state["patched"] = None
