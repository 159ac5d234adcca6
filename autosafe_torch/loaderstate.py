"""What autosafe_torch keeps on a DataLoader: one typed record, read and
written by construction and ``iter()`` (engine/loader.py), the patch that
builds the iterator (patches/dataloader.py), the recovery (recovery/) and
the pickle kept for the next start (remedies/sent_once.py).

Below every layer (they all read it): imports nothing of ours.
"""

from __future__ import annotations

import dataclasses
from typing import Any

ATTRIBUTE = "_autosafe_torch_state"  # in the loader's __dict__


def _shown() -> Any:
    return dataclasses.field(default=None, metadata={"shown": True})


@dataclasses.dataclass(frozen=True)
class Kept:
    """What a worker check's finding keeps on the loader for its iterators: the
    fields it sets (None: not set); those made by ``_shown()`` its record shows
    in ``after`` too. ``LoaderState.kept``: what all of them kept."""
    batch_device: Any = _shown()  # DL301: the device each batch is copied back to
    emulated_workers: int | None = _shown()  # the workers emulated here (Rung.EMULATED)
    fork_handles: bool | None = _shown()  # DL207/DL212: handles reopened in forked workers
    not_rebuilt: str | None = _shown()  # why the rebuild rung was refused, for a refusal
    process_state: Any = None  # DL220: what the workers read, carried (process_state.Carry)
    loggers: Any = None  # DL219: the dataset's loggers travel configured (loggers.Reports)
    rebuilt: tuple[Any, ...] | None = None  # DL201: the datasets built again in each worker

    def given(self, shown: bool = False) -> dict[str, Any]:
        """Its fields given (not None), by name (``shown``: those its record shows)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) is not None and (f.metadata or not shown)}

    def __bool__(self) -> bool:  # whether it keeps anything
        return bool(self.given())


@dataclasses.dataclass
class LoaderState:
    kept: Kept = Kept()  # what the worker checks' findings keep (engine/loader.py)
    # Kept at iter() (engine/loader.py):
    plan_key: Any = None  # what the worker checks read when they last ran
    pending: list[Any] = dataclasses.field(default_factory=list)  # their records, until held
    untouched: bool = False  # the worker checks found nothing to do
    # Kept by a remedy and by the recovery:
    pickled: tuple | None = None  # sent_once: (dataset, its pickle), for the next start
    ladder: Any = None  # recovery/rungs.py: the loader's LoaderLadder

    def keep(self, kept: Kept) -> None:
        """What a finding keeps: the fields it set, over what earlier ones kept."""
        self.kept = dataclasses.replace(self.kept, **kept.given())


def state_of(loader: Any) -> LoaderState:
    """The record kept on ``loader`` (made empty at first)."""
    state = loader.__dict__.get(ATTRIBUTE)
    if state is None:
        state = loader.__dict__[ATTRIBUTE] = LoaderState()
    return state
