"""autosafe_torch: run legacy PyTorch scripts safely on any platform.

``import autosafe_torch`` activates it (unless ``AUTOSAFE_TORCH=0``); so does
``%load_ext autosafe_torch`` in IPython or Jupyter.
Nothing heavy is imported here: the patches are applied when the program
imports torch or cv2.
"""

__version__ = "0.1.0"

from .activation import activate, configure, deactivate, is_active  # noqa: E402

__all__ = ["activate", "configure", "deactivate", "is_active", "interventions",
           "load_ipython_extension", "unload_ipython_extension"]


def interventions():
    """The interventions made in this process so far."""
    from . import report

    return report.interventions()


def load_ipython_extension(ip):
    """``%load_ext autosafe_torch`` in IPython or Jupyter."""
    from . import notebook

    notebook.load(ip)


def unload_ipython_extension(ip):
    """``%unload_ext autosafe_torch``."""
    from . import notebook

    notebook.unload(ip)


def __getattr__(name):
    if name == "UnsafeCallError":
        from .engine import UnsafeCallError as error
    elif name == "NoExactRung":
        from .errors import NoExactRung as error
    else:
        raise AttributeError(name)
    return error


activate("import")
