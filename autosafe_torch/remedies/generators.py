"""The process's random generators, saved and put back: Python's ``random``,
numpy's global one (where imported) and torch's CPU generator, for emulated
workers' fetches and datasets built again in a worker (``rebuild.py``). CUDA
generators are not touched: they are lazy, and a worker has none.
"""

import random
import sys


def capture():
    """``(torch, random, numpy)`` states (numpy's None where it is not imported)."""
    numpy = sys.modules.get("numpy")
    torch = sys.modules["torch"]
    return (torch.default_generator.get_state(), random.getstate(),
            numpy.random.get_state() if numpy is not None else None)


def restore(states):
    torch_state, random_state, numpy_state = states
    sys.modules["torch"].default_generator.set_state(torch_state)
    random.setstate(random_state)
    if numpy_state is not None:
        sys.modules["numpy"].random.set_state(numpy_state)


def same(a, b):
    if a[1] != b[1] or not sys.modules["torch"].equal(a[0], b[0]):
        return False
    if a[2] is None or b[2] is None:
        return a[2] is b[2]
    return all(x == y if not hasattr(x, "shape") else bool((x == y).all())
               for x, y in zip(a[2], b[2]))


def portable(states):
    """Torch's state as bytes: a pickle that must not put a tensor in shared memory."""
    return None if states is None else (bytes(states[0].numpy()),) + tuple(states[1:])


def from_portable(states):
    if states is None:
        return None
    torch = sys.modules["torch"]
    return (torch.frombuffer(bytearray(states[0]), dtype=torch.uint8),) + tuple(states[1:])
