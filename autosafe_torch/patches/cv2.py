"""``import cv2``: threads and OpenCL off in this process and its children.

Applied by the import hook once the outermost ``import cv2`` has finished
(opencv's ``cv2/__init__.py`` re-imports its native module under the name
cv2 while it runs; the hook fires once, with the package that
``sys.modules`` holds afterwards). Nothing is wrapped: two settings are
made, and two environment variables are set for processes started later
(spawn and forkserver DataLoader workers, subprocesses); the DataLoader
checks of ``autosafe_torch.rules.cv2`` add the worker_init_fn step that
covers a forkserver started before cv2 was imported.

Whatever goes wrong here is logged and never reaches ``import cv2``.
"""

import os

from .. import engine

_state = {"patched": None}


def import_site():
    """file:line of the ``import cv2`` that triggered us, or "<import cv2>"."""
    from ..callsite import user_call_site

    site = user_call_site()
    return "<import cv2>" if site == "<unknown>" else site


def findings(cv2, environ=None):
    """CV401 and CV402 for this process, as the rules see them now."""
    from ..config import CONFIG
    from ..rules import RULES, load_all

    load_all()
    env = os.environ if environ is None else environ
    out = []
    threads = cv2.getNumThreads()
    key, value = _env_threads()
    r = RULES["CV401"]
    if CONFIG.rule_enabled(r.code, r.group) and (threads != 0 or key not in env):
        out.append(r.finding(
            {"threads": threads, key: env.get(key)}, {"threads": 0, key: env.get(key, value)},
            "OpenCV's thread pool in a process that forks DataLoader workers; %s=%s "
            "for processes started later" % (key, env.get(key, value)),
            strategy="cv2.setNumThreads(0)", apply=lambda: _threads_off(cv2, env)))
    ocl = getattr(cv2, "ocl", None)
    opencl = bool(ocl.useOpenCL()) if ocl is not None else False
    key, value = _env_opencl()
    r = RULES["CV402"]
    if CONFIG.rule_enabled(r.code, r.group) and (opencl or key not in env):
        out.append(r.finding(
            {"opencl": opencl, key: env.get(key)}, {"opencl": False, key: env.get(key, value)},
            "OpenCL off in this process; %s=%s for processes started later" % (
                key, env.get(key, value)),
            strategy="cv2.ocl.setUseOpenCL(False)", apply=lambda: _opencl_off(cv2, env)))
    return out


def _env_threads():
    from ..rules.cv2 import ENV_THREADS

    return ENV_THREADS


def _env_opencl():
    from ..rules.cv2 import ENV_OPENCL

    return ENV_OPENCL


def _threads_off(cv2, env):
    cv2.setNumThreads(0)
    key, value = _env_threads()
    env.setdefault(key, value)  # a value the user chose stays


def _opencl_off(cv2, env):
    ocl = getattr(cv2, "ocl", None)
    if ocl is not None:
        ocl.setUseOpenCL(False)
    key, value = _env_opencl()
    env.setdefault(key, value)


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
