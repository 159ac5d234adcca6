"""DataLoader arguments that torch itself rejects: each error must reach the user
as torch words it (the same type and message), shim or no shim.

These are the user's mistakes, not platform hazards: a negative timeout, a
negative or zero prefetch_factor, a start method that does not exist, values
of the wrong type.
"""

import re

import torch
from torch.utils.data import DataLoader, TensorDataset

from _common import finish, record_warnings, seed_all, state

CASES = [
    ("timeout=-1", dict(timeout=-1)),
    ("timeout=-1,num_workers=2", dict(timeout=-1, num_workers=2)),
    ("timeout='5'", dict(timeout="5")),
    ("num_workers=-1", dict(num_workers=-1)),
    ("num_workers='2'", dict(num_workers="2")),
    ("prefetch_factor=-1", dict(prefetch_factor=-1)),
    ("prefetch_factor=0", dict(prefetch_factor=0)),
    ("prefetch_factor=-1,num_workers=2", dict(prefetch_factor=-1, num_workers=2)),
    ("multiprocessing_context='bogus'", dict(multiprocessing_context="bogus")),
    ("multiprocessing_context='bogus',num_workers=2",
     dict(multiprocessing_context="bogus", num_workers=2)),
    ("multiprocessing_context=object(),num_workers=2",
     dict(multiprocessing_context=object(), num_workers=2)),
]


def main():
    record_warnings()
    seed_all(15)
    dataset = TensorDataset(torch.arange(8.0))
    for name, kwargs in CASES:
        try:
            loader = DataLoader(dataset, batch_size=2, **kwargs)
            first = next(iter(loader))
        except Exception as exc:
            # an object's repr holds its address: not part of the message to compare
            outcome = re.sub(r" at 0x[0-9a-f]+", "", "%s: %s" % (type(exc).__name__, exc))
        else:
            outcome = "no error: %s" % (first,)
        state("case %s ->" % name, outcome)
    finish()


if __name__ == "__main__":
    main()
