"""``activate()`` and ``deactivate()``: the one entry for every activation.

The import, the ``.pth`` hook, sitecustomize and ``autosafe-torch run`` all
end here. Activation is idempotent (``site`` may run a ``.pth`` line twice)
and cheap: it installs a small import finder and imports nothing heavy; the
patches are applied when the user imports torch or cv2.
"""

import contextlib
import os
import sys

from . import config as c, rehearsal
from .config import CONFIG, ENV_SWITCH, switch_state
from .importhook import PostImportFinder

_state = {"finder": None, "set_switch": False, "fork_hook": False}


def _hook_error(where, exc):
    from .report import internal_error

    internal_error(where, exc)


def _on_import(name, module):
    from . import patches

    patches.apply_for(name, module)


def is_active():
    return _state["finder"] is not None


def activate(source="import"):
    """Turn autosafe_torch on for this process and, through the environment,
    for its workers and children. ``AUTOSAFE_TORCH=0`` wins: returns False."""
    if switch_state() is False:
        return False
    if _state["finder"] is not None:
        return True
    if ENV_SWITCH not in os.environ:  # for workers and children; deactivate() takes it back
        os.environ[ENV_SWITCH] = "1"
        _state["set_switch"] = True
    from .patches import TARGETS

    late = [name for name in TARGETS if name in sys.modules]
    _state["finder"] = PostImportFinder(TARGETS, _on_import, _hook_error)
    # In a fork server (multiprocessing's, DL209's warm one) each child gets, as it
    # forks, a description of its own of every file the server reads (remedies/
    # isolation.py). Once per process; a lookup per fork elsewhere.
    if not _state["fork_hook"] and hasattr(os, "register_at_fork"):
        _state["fork_hook"] = True
        os.register_at_fork(after_in_child=_after_fork_in_child)
    # A spawned worker (activated through the environment before its start runs)
    # writes an exception that ends its start (unpickling the dataset, importing
    # the main module) where the parent's recovery reads it (diagnostics.told).
    if getattr(sys, "argv", [])[-1:] == ["--multiprocessing-fork"]:
        with contextlib.suppress(Exception):
            from .inspection import diagnostics

            diagnostics.listen_as_spawned()
    try:
        rehearsal.apply()
    except Exception as exc:  # never at interpreter start
        _hook_error("AUTOSAFE_TORCH_AS", exc)
    if late and source != "worker":
        import logging

        from .report import log

        log(logging.INFO, "activated after %s was imported (%s); objects created "
            "before now were not checked", " and ".join(late), source)
    return True


def _after_fork_in_child():
    if "multiprocessing.forkserver" not in sys.modules or _state["finder"] is None \
            or CONFIG.mode != "fix":
        return
    with contextlib.suppress(Exception):  # never break a fork
        from .remedies import isolation

        if CONFIG.rule_enabled(*isolation.GOVERNED_BY):
            isolation.after_fork_in_server_child()


def deactivate():
    """Restore every original and stop watching imports (and take back the
    ``AUTOSAFE_TORCH=1`` that ``activate`` set for workers and children)."""
    finder = _state["finder"]
    if finder is None:
        return
    _state["finder"] = None
    if _state["set_switch"] and os.environ.get(ENV_SWITCH) == "1":
        del os.environ[ENV_SWITCH]
    _state["set_switch"] = False
    finder.uninstall()
    from . import patches

    patches.revert()


def configure(mode=None, disable=None, log_file=None, quiet=None, debug=None):
    """The environment's settings, from code. Invalid values: one warning, default.
    Sets the matching variables too, so that spawned workers agree."""
    if mode is not None:
        CONFIG.mode = c.parse_mode(str(mode), "configure(mode=...)")
        os.environ[c.ENV_MODE] = CONFIG.mode
    if disable is not None:
        try:
            text = disable if isinstance(disable, str) else ",".join(str(t) for t in disable)
        except TypeError:
            c.warn_line("configure(disable=...)=%r is neither a string nor a list of rule "
                        "codes or groups; keeping %s" % (
                            disable, ",".join(sorted(CONFIG.disabled)) or "none"))
        else:
            CONFIG.disabled = c.parse_disable(text)
            CONFIG._validated = False
            os.environ[c.ENV_DISABLE] = text
    if log_file is not None:
        CONFIG.log_file = c.parse_log_file(log_file, "configure(log_file=...)")
        os.environ[c.ENV_LOG_FILE] = CONFIG.log_file or ""
    for name, value, env in (("quiet", quiet, c.ENV_QUIET), ("debug", debug, c.ENV_DEBUG)):
        if value is None:
            continue
        # True, False, 0, 1 or words as in the environment; anything else is
        # refused, not truth-tested (configure(quiet="no") must not mean quiet).
        if not (isinstance(value, int) and value in (0, 1)):
            value = c.parse_bool("configure(%s=...)" % name,
                                 value if isinstance(value, str) else repr(value),
                                 getattr(CONFIG, name))
        setattr(CONFIG, name, bool(value))
        os.environ[env] = "1" if value else "0"
    if debug is not None and "autosafe_torch.report" in sys.modules:
        import logging

        from .report import logger

        logger.setLevel(logging.DEBUG if CONFIG.debug else logging.INFO)
    return CONFIG.as_dict()
