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


@dataclasses.dataclass
class LoaderState:
    # From the worker checks' findings (their ``state``, by these names; a
    # leading "_" there keeps the name out of the record's ``after``):
    batch_device: Any = None  # DL301: the device each batch is copied back to
    emulated_workers: int = 0  # the workers emulated in this process (Rung.EMULATED)
    fork_handles: bool = False  # DL207/DL212: native handles reopened in each forked worker
    not_rebuilt: str | None = None  # why the rebuild rung was refused, for a refusal's words
    process_state: Any = None  # DL220: what the workers read, carried (process_state.Carry)
    loggers: Any = None  # DL219: the dataset's loggers travel configured (loggers.Reports)
    rebuilt: list[Any] = dataclasses.field(default_factory=list)  # built again in each worker
    # Kept at iter() (engine/loader.py):
    plan_key: Any = None  # what the worker checks read when they last ran
    pending: list[Any] = dataclasses.field(default_factory=list)  # their records, until held
    untouched: bool = False  # the worker checks found nothing to do
    # Kept by a remedy and by the recovery:
    pickled: tuple | None = None  # sent_once: (dataset, its pickle), for the next start
    ladder: Any = None  # recovery/rungs.py: the loader's LoaderLadder

    def keep(self, found: dict[str, Any]) -> None:
        """A finding's ``state``, kept; a name this record has no field for is
        an error of ours (a rule that keeps what nothing reads)."""
        for name, value in found.items():
            field = name.lstrip("_")
            if field not in _FROM_FINDINGS:
                raise KeyError("a finding keeps %r, which no loader state reads" % name)
            setattr(self, field, value)


_FROM_FINDINGS = ("batch_device", "emulated_workers", "fork_handles", "not_rebuilt",
                  "process_state", "loggers", "rebuilt")


def state_of(loader: Any) -> LoaderState:
    """The record kept on ``loader`` (made empty at first)."""
    state = loader.__dict__.get(ATTRIBUTE)
    if state is None:
        state = loader.__dict__[ATTRIBUTE] = LoaderState()
    return state
