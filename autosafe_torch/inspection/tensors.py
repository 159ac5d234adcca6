"""Accelerator tensors a dataset holds: where, on which device, how big.

Looking is bounded by the shared walk's bounds (``objwalk``), copies nothing
and calls no ``__getitem__``: it follows instance attributes, slots, lists,
tuples and dict values, which covers TensorDataset, ConcatDataset, Subset and
ChainDataset. A model (``nn.Module``), numpy and pandas objects are never
entered: a model is the program's, not the dataset's.
"""

import sys

from . import objwalk

# Device types whose tensors cannot be handed to a DataLoader worker.
ACCELERATORS = frozenset(("cuda", "mps", "xpu", "hpu", "npu", "mtia", "xla",
                          "privateuseone"))
# How many paths a description names before "and N more".
NAMED = 6


class HeldTensor:
    """One tensor found in a dataset: where, on which device, how big."""

    __slots__ = ("path", "tensor", "part")

    def __init__(self, path, tensor, part):
        self.path = path
        self.tensor = tensor
        self.part = part  # index of the ConcatDataset/ChainDataset part, or None

    @property
    def device(self):
        return str(self.tensor.device)

    @property
    def device_type(self):
        return self.tensor.device.type

    @property
    def nbytes(self):
        t = self.tensor
        return t.numel() * t.element_size()


class TensorScan:
    __slots__ = ("found", "complete")

    def __init__(self):
        self.found = []
        self.complete = True

    def on(self, devices):
        return [f for f in self.found if f.device_type in devices]


def _torch():
    return sys.modules.get("torch")


def never_entered(obj, torch):
    """Leaves, models, numpy and pandas objects: no dataset tensor inside."""
    if objwalk.is_a(obj, objwalk.ATOMIC) or objwalk.is_a(obj, objwalk.OPAQUE):
        return True
    if torch is not None and objwalk.is_a(obj, torch.nn.Module):
        return True  # a model is the program's, not the dataset's: never moved
    name = type(obj).__module__
    return name.startswith("numpy") or name.startswith("pandas")


def scan(root, path="dataset", items=None, max_objects=objwalk.MAX_OBJECTS):
    """The tensors reachable from ``root``, within the walk's bounds.

    Looks at ``items`` items per container, and at every part of a
    ConcatDataset/ChainDataset; ``relocate`` passes None to find every tensor.
    """
    torch = _torch()
    result = TensorScan()
    if torch is None:
        return result
    parts = dataset_parts(root, torch)

    def stop(obj):
        return obj is parts or objwalk.is_a(obj, torch.Tensor) or never_entered(obj, torch)

    def cut():
        result.complete = False

    roots = [(path, root, None)]
    for here, obj, _edge in objwalk.walk(root, path, stop=stop, items=items,
                                          max_objects=max_objects, on_cut=cut):
        if obj is parts:
            roots += [("%s[%d]" % (here, i), part, i) for i, part in enumerate(parts)]
        elif objwalk.is_a(obj, torch.Tensor):
            result.found.append(HeldTensor(here, obj, None))
    for here, part, index in roots[1:]:
        for there, obj, _edge in objwalk.walk(part, here, stop=stop, items=items,
                                               max_objects=max_objects, on_cut=cut):
            if objwalk.is_a(obj, torch.Tensor):
                result.found.append(HeldTensor(there, obj, index))
    return result


def dataset_parts(root, torch):
    """The list of parts of a ConcatDataset/ChainDataset at the top (through Subsets)."""
    data = torch.utils.data
    node = root
    for _ in range(8):
        if objwalk.is_a(node, data.Subset):
            node = node.dataset
            continue
        break
    if objwalk.is_a(node, (data.ConcatDataset, data.ChainDataset)):
        parts = node.datasets
        return parts if isinstance(parts, (list, tuple)) else None
    return None


def describe(found):
    """'dataset.tensors[0] (cuda:0, 4.0 MiB), ...' for a log line."""
    seen = set()
    unique = []
    for f in found:
        if id(f.tensor) not in seen:
            seen.add(id(f.tensor))
            unique.append(f)
    named = ", ".join("%s (%s, %s)" % (f.path, f.device, _size(f.nbytes))
                      for f in unique[:NAMED])
    more = len(unique) - NAMED
    total = _size(sum(f.nbytes for f in unique))
    return "%s%s; %s in all" % (named, " and %d more" % more if more > 0 else "", total)


def _size(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return ("%d %s" % (n, unit)) if unit == "B" else ("%.1f %s" % (n, unit))
        n /= 1024.0


def batch_device(dataset):
    """The one device every batch of ``dataset`` is on, where that is certain.

    A TensorDataset (alone, or in Subset/ConcatDataset) whose tensors all sit
    on one accelerator yields samples made only of those tensors, so each
    batch is wholly on that device: after the move to CPU, the loader can
    copy each batch back, and the script sees the very batches it had.
    Other datasets may mix devices within a sample: None.
    """
    from torch.utils.data import ConcatDataset, Subset, TensorDataset  # noqa: PLC0415 - the rules load without torch (explain, doctor)

    pending, devices = [dataset], set()
    while pending:
        part = pending.pop()
        if objwalk.is_a(part, Subset):
            pending.append(part.dataset)
        elif objwalk.is_a(part, ConcatDataset):
            pending.extend(part.datasets)
        elif objwalk.is_a(part, TensorDataset):
            devices.update(t.device for t in part.tensors)
        else:
            return None
    if len(devices) != 1:
        return None
    (device,) = devices
    return str(device) if device.type in ACCELERATORS else None
