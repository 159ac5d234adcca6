"""Accelerator tensors a dataset holds: where, on which device, how big; and
where a CPU tensor's bytes lie in a file this process maps (``reference``:
what ``remedies/mapped_tensors.py`` sends to a worker instead, DL218).

Looked for with the shared walk (``objwalk``), which never enters a model
(``nn.Module``: the program's, not the dataset's), numpy or pandas objects.
"""

import collections
import sys

from . import objwalk

# Device types whose tensors cannot be handed to a DataLoader worker.
ACCELERATORS = frozenset(("cuda", "mps", "xpu", "hpu", "npu", "mtia", "xla",
                          "privateuseone"))
# How many paths a description names before "and N more".
NAMED = 6


class HeldTensor(collections.namedtuple("HeldTensor", "path tensor part")):
    """``part``: the index of its ConcatDataset/ChainDataset part, or None."""

    __slots__ = ()

    @property
    def device(self):
        return str(self.tensor.device)

    @property
    def device_type(self):
        return self.tensor.device.type

    @property
    def nbytes(self):
        return self.tensor.numel() * self.tensor.element_size()


class TensorScan:
    __slots__ = ("found", "complete")

    def __init__(self):
        self.found = []
        self.complete = True

    def on(self, devices):
        return [f for f in self.found if f.device_type in devices]


def never_entered(obj, torch):
    """Leaves, models (the program's, never moved), numpy and pandas objects."""
    if objwalk.is_a(obj, objwalk.ATOMIC) or objwalk.is_a(obj, objwalk.OPAQUE) \
            or torch is not None and objwalk.is_a(obj, torch.nn.Module):
        return True
    name = type(obj).__module__
    return name.startswith("numpy") or name.startswith("pandas")


def scan(root, path="dataset", items=None, max_objects=objwalk.MAX_OBJECTS):
    """The tensors reachable from ``root``, within the walk's bounds: ``items``
    items per container (``relocate``: None, every tensor), and every part of
    a ConcatDataset/ChainDataset."""
    torch = sys.modules.get("torch")
    result = TensorScan()
    if torch is None:
        return result
    parts = dataset_parts(root, torch)

    def stop(obj):
        return obj is parts or objwalk.is_a(obj, torch.Tensor) or never_entered(obj, torch)

    roots = [(path, root, None)]
    for top, start, index in roots:  # the root, then each part it reaches (appended)
        for here, obj, _edge in objwalk.walk(start, top, stop=stop, items=items,
                                              max_objects=max_objects,
                                              on_cut=lambda: setattr(result, "complete", False)):
            if obj is parts and index is None:
                roots += [("%s[%d]" % (here, i), part, i) for i, part in enumerate(parts)]
            elif objwalk.is_a(obj, torch.Tensor):
                result.found.append(HeldTensor(here, obj, index))
    return result


def dataset_parts(root, torch):
    """The list of parts of a ConcatDataset/ChainDataset at the top (through Subsets)."""
    data = torch.utils.data
    node = root
    for _ in range(8):
        if not objwalk.is_a(node, data.Subset):
            break
        node = node.dataset
    if objwalk.is_a(node, (data.ConcatDataset, data.ChainDataset)):
        parts = node.datasets
        return parts if isinstance(parts, (list, tuple)) else None
    return None


def describe(found):
    """'dataset.tensors[0] (cuda:0, 4.0 MiB), ...' for a log line."""
    first = {}
    for f in found:
        first.setdefault(id(f.tensor), f)
    unique = list(first.values())
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
    """The one device every batch of ``dataset`` is on, where that is certain:
    a TensorDataset (alone, or in Subset/ConcatDataset) whose tensors all sit
    on one accelerator yields samples of those tensors only, so after the move
    to CPU the loader can copy each batch back, and the script sees the very
    batches it had. Other datasets may mix devices within a sample: None."""
    from torch.utils.data import ConcatDataset, Subset, TensorDataset  # noqa: PLC0415 - torch: this module loads with the rules at `import cv2`, before the program imports torch

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


# -- tensors mapped from a file (DL218) ---------------------------------------------

# Where torch's shared memory and shm_open's segments lie (a file of the user's
# there is mapped again, a storage torch shares stays torch's).
SHARED_MEMORY = "/dev/shm/"


class TensorReference(collections.namedtuple(
        "TensorReference",
        "path ident offset nbytes dtype size stride storage_offset requires_grad")):
    """What a worker needs to map a tensor again (``ident``: device, inode,
    mtime in ns, size; ``offset``, ``nbytes``: the storage's bytes in the file)."""

    __slots__ = ()

    def args(self, cls):
        return (cls, *self)

    @property
    def file(self):
        return self.ident[:2]


def plain_tensor(tensor):
    """Whether torch's reducer rebuilds ``tensor`` as a view of its storage's
    bytes and nothing more."""
    torch = sys.modules.get("torch")
    if torch is None or type(tensor) not in (torch.Tensor, torch.nn.Parameter) \
            or tensor.device.type != "cpu" or tensor.layout != torch.strided \
            or tensor.is_quantized or tensor.is_nested or tensor.is_conj() or tensor.is_neg() \
            or tensor.requires_grad and not tensor.is_leaf:  # torch refuses that: its error stays
        return False
    from .. import torch_private as tp  # noqa: PLC0415 - imports torch: this module loads with the rules at `import cv2`, before the program imports torch

    return not tp.backward_hooks(tensor)  # torch warns of them


def reference(tensor, maps=None):
    """``(TensorReference, None)`` where ``tensor`` can go by reference
    exactly; ``(None, why not)`` where its storage lies in a file mapping but
    cannot; ``(None, None)`` where it lies in none (or cannot be known to:
    no ``/proc/self/maps``): nothing to say of it."""
    from .mappings import _ANONYMOUS, Maps, mapped_file  # noqa: PLC0415 - 0.2 ms at `import torch` and at `import cv2`, where tensors loads (-X importtime: inspection.mappings)

    maps = Maps() if maps is None else maps
    if maps.mappings is None or not plain_tensor(tensor):
        return None, None
    storage = tensor.untyped_storage()
    address, nbytes = storage.data_ptr(), storage.nbytes()
    if nbytes == 0:
        return None, None
    where = maps.holding(address)
    if where is None or where.path.startswith(_ANONYMOUS) \
            or where.path.startswith(SHARED_MEMORY) and storage.is_shared():
        return None, None  # memory of no file, or torch's shared memory: it stays shared
    where, st, why = mapped_file(address, nbytes, maps)
    if where is None:
        return None, why
    if not where.shared and maps.written_to(where) != 0:
        return None, "a private map this process wrote to: its changes are in no file"
    return TensorReference(
        where.path, (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size),
        where.offset + (address - where.start), nbytes, tensor.dtype, tuple(tensor.size()),
        tuple(tensor.stride()), tensor.storage_offset(), tensor.requires_grad), None
