"""The one pickler our repairs' reducers live in: ``WorkerPickler``.

The repairs that make a dataset travel to spawn/forkserver workers are
reducers: planning only names them (the probe tries them without
installing anything); they are installed when a finding is applied, in fix
mode, into ``WorkerPickler``, a ``ForkingPickler`` of our own. Only what the
shim sends to workers is pickled with it: the process object of a worker it
starts (``WorkerContext``: the loader's context for that start, whose
processes pickle their state with it), an emulated worker's copy. The
process-wide ``ForkingPickler``, with which the program's own ``Queue.put``,
``Pipe.send`` and ``Pool.map`` pickle, is never touched: they fail or
succeed as they would without us.
"""

from __future__ import annotations

import copyreg
import io
import pickle
from collections.abc import Mapping
from multiprocessing.reduction import ForkingPickler
from typing import Any, Callable, ClassVar

from ..mp_private import extra_reducers

PROTOCOL = pickle.DEFAULT_PROTOCOL

Reducer = Callable[[Any], Any]
Override = Callable[[Any, Any], Any]


def built_from_attributes(cls, state):
    """In a worker: an instance of ``cls`` as pickle's default builds it
    (``cls.__new__``, then its ``__dict__``), without asking the empty
    instance for ``__setstate__``: a class that forwards unknown attributes
    would recurse there (``holdings.forwards_attributes``)."""
    obj = cls.__new__(cls)
    object.__getattribute__(obj, "__dict__").update(state)
    return obj


def reduce_from_attributes(obj):
    return built_from_attributes, (type(obj), dict(object.__getattribute__(obj, "__dict__")))


def forwarder_reducers(classes):
    """Reducers for instances of ``classes`` (attribute forwarders)."""
    return {cls: reduce_from_attributes for cls in classes}


class WorkerPickler(ForkingPickler):
    """ForkingPickler's reducers (torch's, the program's), then ours; and
    ``override`` (functions and classes by value) where one is installed."""

    ours: ClassVar[dict[type, Reducer]] = {}
    override: ClassVar[Override | None] = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        override = WorkerPickler.override
        if override is not None:
            # an instance attribute, set before pickle looks for it: where none
            # is installed, pickling pays nothing for a reducer_override
            self.reducer_override = lambda obj: override(self, obj)  # type: ignore[method-assign]
        super().__init__(*args, **kwargs)
        self.dispatch_table.update(self.ours)

    @classmethod
    def acts(cls) -> bool:
        """Whether pickling with it differs from ForkingPickler's."""
        return bool(cls.ours) or cls.override is not None


def install(reducers: Mapping[type, Reducer]) -> None:
    """Register ``{class: reducer}`` with ``WorkerPickler`` (a class we reduce
    already gets the newer reducer)."""
    WorkerPickler.ours.update(reducers)


def install_override(reducer_override: Override) -> None:
    """Give ``WorkerPickler`` a ``reducer_override`` (functions and classes by value)."""
    WorkerPickler.override = reducer_override


def uninstall(cls: type) -> None:
    """Take back our reducer for ``cls``."""
    WorkerPickler.ours.pop(cls, None)


def installed(cls: type) -> Reducer | None:
    """Our reducer for ``cls``, or None."""
    return WorkerPickler.ours.get(cls)


def before_us(cls: type) -> Reducer | None:
    """The reducer ``cls`` has without us (None: pickle's own way)."""
    return extra_reducers().get(cls)


def uninstall_reducers() -> None:
    """Take back every reducer installed here (tests: each as a fresh process)."""
    WorkerPickler.ours.clear()
    WorkerPickler.override = None


# -- the processes of our workers' starts ----------------------------------------------

class _Pickled:
    """A pickle made with ``WorkerPickler``, inside the one multiprocessing
    makes: the child loads it with ``pickle.loads``, nothing of ours."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __reduce__(self) -> Any:
        return pickle.loads, (self.data,)


def _reduce_process(process: Any) -> Any:
    """A worker process object as pickle's default sends it (its class, then
    its ``__dict__``), the ``__dict__`` pickled with ``WorkerPickler``. It runs
    inside the Popen's own dump, so what needs the starting Popen (a file
    descriptor passed, the authentication key) has it."""
    buffer = io.BytesIO()
    WorkerPickler(buffer, PROTOCOL).dump(vars(process))
    # getvalue() hands over the buffer's own bytes where they fill it (no copy):
    # at 1.28M samples the state is some 30 MB, and a second copy of it showed
    # in the training process's peak memory (figure 19c)
    return (copyreg._reconstructor, (type(process).__mro__[1], object, None),  # type: ignore[attr-defined]  # pickle's own protocol-0 path
            _Pickled(buffer.getvalue()))


_sent_classes: dict[type, type] = {}


def _sent_class(cls: type) -> type:
    """``cls`` (a context's Process class) whose instances pickle with
    ``WorkerPickler``; its name is ``cls``'s, so its repr is the same."""
    sent = _sent_classes.get(cls)
    if sent is None:
        sent = _sent_classes[cls] = type(cls.__name__, (cls,), {
            "__reduce__": _reduce_process, "__module__": cls.__module__})
    return sent


class WorkerContext:
    """A loader's multiprocessing context (or the ``torch.multiprocessing``
    module torch uses without one) whose processes pickle with ``WorkerPickler``
    (the loader's context while the shim starts its workers)."""

    def __init__(self, context: Any) -> None:
        self._context = context

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)

    def Process(self, *args: Any, **kwargs: Any) -> Any:  # noqa: N802 - multiprocessing's name
        process = self._context.Process(*args, **kwargs)
        process.__class__ = _sent_class(type(process))
        return process
