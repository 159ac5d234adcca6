"""The one pickler our repairs' reducers live in: ``WorkerPickler``.

The repairs that make a dataset travel to spawn/forkserver workers are
reducers, tried uninstalled by the plan's probe, installed in fix mode into
``WorkerPickler``, which pickles only what the shim sends to workers (a
worker's process object: ``WorkerContext``; an emulated worker's copy). The
process-wide ``ForkingPickler`` (the program's ``Queue.put``, ``Pipe.send``,
``Pool.map``) is never touched: they fail or succeed as without us.
"""

from __future__ import annotations

import functools
import pickle
from collections.abc import Mapping
from multiprocessing import reduction
from multiprocessing.reduction import ForkingPickler
from typing import Any, Callable, ClassVar

from ..mp_private import extra_reducers, popen_reading, start_through

PROTOCOL = pickle.DEFAULT_PROTOCOL

Reducer = Callable[[Any], Any]
Override = Callable[[Any, Any], Any]


def built_from_attributes(cls, state):
    """In a worker: an instance of ``cls`` as pickle's default builds it, without
    asking the empty instance for ``__setstate__``: a class that forwards
    unknown attributes would recurse there (``holdings.forwards_attributes``)."""
    obj = cls.__new__(cls)
    object.__getattribute__(obj, "__dict__").update(state)
    return obj


def reduce_from_attributes(obj):
    return built_from_attributes, (type(obj), dict(object.__getattribute__(obj, "__dict__")))


def forwarder_reducers(classes):
    return {cls: reduce_from_attributes for cls in classes}


class WorkerPickler(ForkingPickler):
    """ForkingPickler's reducers (torch's, the program's), then ours; and
    ``override`` (functions and classes by value) where one is installed."""

    ours: ClassVar[dict[type, Reducer]] = {}
    override: ClassVar[Override | None] = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        override = WorkerPickler.override
        if override is not None:
            # an instance attribute: where none is installed, pickling pays nothing for it
            self.reducer_override = lambda obj: override(self, obj)  # type: ignore[method-assign]
        super().__init__(*args, **kwargs)
        self.dispatch_table.update(self.ours)

    @classmethod
    def acts(cls) -> bool:
        """Whether pickling with it differs from ForkingPickler's."""
        return bool(cls.ours) or cls.override is not None


def install(reducers: Mapping[type, Reducer]) -> None:
    """The newer reducer for a class wins."""
    WorkerPickler.ours.update(reducers)


def installed(cls: type) -> Reducer | None:
    return WorkerPickler.ours.get(cls)


def before_us(cls: type) -> Reducer | None:
    """The reducer ``cls`` has without us (None: pickle's own way)."""
    return extra_reducers().get(cls)


def uninstall_reducers() -> None:
    """For tests: each as a fresh process."""
    WorkerPickler.ours.clear()
    WorkerPickler.override = None


# -- the processes of our workers' starts ----------------------------------------------

class Overriding:
    """``module`` with ``overrides``, as the stdlib's Popen code reads it
    (``popen_reading``)."""

    def __init__(self, module: Any, **overrides: Any) -> None:
        self._module = module
        self.__dict__.update(overrides)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)


def _dump(obj: Any, file: Any, protocol: int | None = None) -> None:
    WorkerPickler(file, protocol).dump(obj)


# What the stdlib's own ``_launch`` dumps goes with ``WorkerPickler``, so what needs the
# starting Popen (a descriptor passed, the authentication key) has it.
TO_WORKERS = Overriding(reduction, dump=_dump)


@functools.cache
def sent_popen(start_method: str) -> type:
    """The stdlib's Popen for ``start_method``, sending with ``WorkerPickler``."""
    return popen_reading(start_method, "Popen", {"reduction": TO_WORKERS})


def WorkerContext(context: Any, start_method: str) -> Any:  # noqa: N802 - once a class
    """``context`` (or ``torch.multiprocessing``), its processes sent with
    ``WorkerPickler``."""
    popen = sent_popen(start_method)

    def process(*args: Any, **kwargs: Any) -> Any:
        started = context.Process(*args, **kwargs)
        start_through(started, popen)  # the warm start's sends with WorkerPickler itself
        return started

    return Overriding(context, Process=process)
