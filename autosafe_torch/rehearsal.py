"""Platform rehearsal: run a script here as it would run on another platform.

``autosafe-torch run --as macos train.py`` (or ``AUTOSAFE_TORCH_AS=macos``
with the ``.pth`` activation) sets that platform's default start method and
the platform the rules see, so a Linux machine (a CI runner) shows what a Mac
user gets: spawn workers, and no fork rung in the repair ladder (fork is
unsafe on macOS and absent on Windows). A script that sets its own start
method still wins, as it would there.
"""

import os
import sys

from .config import ENV_AS, warn_line

# name -> (sys.platform there, its default start method)
PLATFORMS = {
    "macos": ("darwin", "spawn"),
    "windows": ("win32", "spawn"),
    "linux-py314": ("linux", "forkserver"),
    "linux": ("linux", "fork"),
}

_warned = []


def rehearsed():
    """The rehearsed platform's name, or None; an unknown name: one line, None."""
    value = (os.environ.get(ENV_AS) or "").strip().lower()
    if not value or value in PLATFORMS:
        return value or None
    if not _warned:
        _warned.append(value)
        warn_line("%s=%r is not one of %s; running as this machine is" % (
            ENV_AS, os.environ.get(ENV_AS), ", ".join(PLATFORMS)))
        os.environ.pop(ENV_AS, None)  # children agree, and do not warn again
    return None


def platform():
    """The ``sys.platform`` the rules see."""
    name = rehearsed()
    return PLATFORMS[name][0] if name else sys.platform


def apply():
    """Set the rehearsed platform's start method (once, in the process that runs
    the script: workers inherit what they need through the environment)."""
    name = rehearsed()
    if name is not None:
        import multiprocessing

        method = PLATFORMS[name][1]
        if multiprocessing.get_start_method(allow_none=True) is None \
                and method in multiprocessing.get_all_start_methods():
            multiprocessing.set_start_method(method)  # a method the program set stays
