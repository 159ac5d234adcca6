"""``%load_ext autosafe_torch``: the shim for a Jupyter kernel and its workers.

The import already activates it, with ``AUTOSAFE_TORCH=1`` in the kernel's
environment so that DataLoader workers (and any process the kernel starts)
are covered too; loading says so. ``%unload_ext`` restores torch's and cv2's
originals in the kernel and takes that setting back. In a kernel call sites
name cells (``Cell In[4], line 6``, ``callsite.place``), and DL202/DL203's fix
says to move the function or class into a module next to the notebook: a
worker cannot import a notebook.
"""

import logging

from . import activation, report
from .config import ENV_SWITCH


def load(ip=None):
    if not activation.activate("notebook"):  # AUTOSAFE_TORCH=0 in the kernel's environment wins
        report.log(logging.WARNING, "%s=0 in this kernel's environment: left off", ENV_SWITCH)
        return
    report.log(logging.INFO, "%s", "on in this kernel and its DataLoader workers "
        "(%unload_ext autosafe_torch turns it off)")


def unload(ip=None):
    if not activation.is_active():
        return
    activation.deactivate()
    line = report.summary_line()
    report.log(logging.INFO, "off in this kernel%s", ("; " + line) if line else "")
