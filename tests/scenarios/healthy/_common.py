"""Shared by the healthy scenarios: what each one prints for the test to compare.

A scenario is a plain, correct training-data script. It prints

- ``BATCHES <sha256>`` over every batch it receives, in order (``digest``);
- ``STATE <key> <value>`` for what the dataset and the parent can observe:
  fetch counts, RNG states, queue contents, warnings torch gave (``state``).

``tests/test_healthy.py`` runs each scenario without and with autosafe_torch
and requires every such line to be equal. Nothing here is imported by the
shim; everything is deterministic for a given seed, whatever the start method.
"""

import hashlib
import pickle
import random
import struct
import sys
import warnings


def state(key, value):
    print("STATE %s %s" % (key, value), flush=True)


def fingerprint(obj):
    """A short stable hash of a picklable value (RNG states, lists)."""
    return hashlib.sha256(pickle.dumps(obj, protocol=4)).hexdigest()[:16]


def _feed(h, obj):
    import torch

    if isinstance(obj, torch.Tensor):
        h.update(("%s %s %s" % (obj.device, obj.dtype, tuple(obj.shape))).encode())
        h.update(obj.detach().cpu().contiguous().numpy().tobytes())
    elif isinstance(obj, dict):
        for key in sorted(obj):
            h.update(repr(key).encode())
            _feed(h, obj[key])
    elif isinstance(obj, (list, tuple)):
        h.update(type(obj).__name__.encode() + b"[")
        for item in obj:
            _feed(h, item)
        h.update(b"]")
    else:
        h.update(repr(obj).encode())


def digest_of(batches):
    h = hashlib.sha256()
    for batch in batches:
        _feed(h, batch)
    return h.hexdigest()


def digest(loader, epochs=1):
    """Print and return a sha256 over every batch of ``epochs`` epochs, in order."""
    h = hashlib.sha256()
    for _ in range(epochs):
        for batch in loader:
            _feed(h, batch)
    print("BATCHES", h.hexdigest(), flush=True)
    return h.hexdigest()


def rng_states():
    """The parent's global RNGs (torch, random, numpy): a loader draws its
    base seed from torch's, and nothing else may draw from them."""
    import numpy as np
    import torch

    return fingerprint((torch.get_rng_state().numpy().tobytes(), random.getstate(),
                        repr(np.random.get_state())))


def finish():
    """Last lines of every scenario: the parent's RNG states after the run."""
    state("parent_rng", rng_states())


def _show(message, category, filename, lineno, file=None, line=None):
    # Warnings are observable: torch's own (e.g. too many workers) must reach the user.
    # ResourceWarning is not: when the garbage collector closes a file varies.
    if issubclass(category, ResourceWarning):
        return
    text = str(message).splitlines()[0] if str(message) else ""
    print("STATE warning %s: %s" % (category.__name__, text), flush=True)


def record_warnings():
    warnings.simplefilter("always")
    warnings.showwarning = _show


def seed_all(seed):
    import numpy as np
    import torch

    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


def num_workers(default=2):
    """Scenarios take the worker count as their first argument."""
    return int(sys.argv[1]) if len(sys.argv) > 1 else default


# -- a file of fixed-size (key, value) records, for the open-file scenarios ----

RECORD = struct.Struct("<qd")


def write_records(path, n, scale):
    """Records (i, i * scale) for i < n."""
    with open(path, "wb") as out:
        for i in range(n):
            out.write(RECORD.pack(i, i * scale))


def key_value_pairs(batches):
    """(key, value) pairs of (key, value, augmentation) batches, without the
    augmentation (which depends on the workers)."""
    return [(k.tolist(), v.tolist()) for k, v, _ in batches]
