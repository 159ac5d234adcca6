"""``Dataset.__new__``: each dataset's constructor arguments, recorded.

A dataset that holds what no spawned worker can receive (a ParquetFile, a
safetensors handle) can be built again there from the arguments it was
built with (``remedies/rebuild.py``). ``__new__`` sees them for every
subclass, whatever its ``__init__``; it records plain values only and then
does what ``__new__`` did before: the next ``__new__`` along the class's MRO
(``object.__new__`` for nearly every dataset), so a mixin's own ``__new__``
still runs.
"""

from . import replace


def patch(torch):
    from torch.utils.data import Dataset

    replace(Dataset, "__new__", staticmethod(_recording_new))


def _recording_new(cls, *args, **kwargs):
    from torch.utils.data import Dataset

    following = super(Dataset, cls).__new__
    if following is object.__new__:
        if (args or kwargs) and cls.__init__ is object.__init__:
            # what object.__new__ says when neither method takes arguments
            raise TypeError("%s() takes no arguments" % cls.__name__)
        obj = object.__new__(cls)
    else:
        obj = following(cls, *args, **kwargs)
    if args or kwargs or cls.__init__ is not object.__init__:
        try:
            from ..remedies import rebuild

            rebuild.record(obj, cls, args, kwargs)
        except Exception:  # a recipe is an option: never the user's problem
            pass
    return obj
