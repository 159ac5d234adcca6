"""Accelerator tensors held by a dataset (DL301, DL302).

A dataset built with ``TensorDataset(x.cuda(), y.cuda())`` works with
``num_workers=0``. With workers it does not: a forked worker that touches a
CUDA tensor dies with "Cannot re-initialize CUDA in forked subprocess" or
"CUDA error: initialization error"; MPS and XPU tensors do not reach a
worker at all. Under spawn/forkserver, CUDA tensors travel by CUDA IPC: it
works, at the price of one CUDA context per worker.

A ConcatDataset whose parts live on different devices fails in collate,
even with no workers: "Expected all tensors to be on the same device".

The fix moves the tensors to CPU, in place on the dataset: every tensor
object found is replaced by one CPU tensor, so a tensor referenced twice
stays one tensor, and views of one storage stay views of one CPU storage.
With CUDA, ``pin_memory`` is turned on so that the copy back
(``.to(device, non_blocking=True)``) is fast.

The batches' device is part of what a loader yields. Where every batch is
certainly on one device (a TensorDataset on one accelerator), the loader
copies each batch back to it after the move, so the script sees the very
batches it had. Otherwise batches arrive on CPU: that is done only where the
script could not run as it is (fork workers, MPS/XPU); where it works (a
dataset on one device with no workers, or CUDA tensors shared with spawn
workers through CUDA IPC), DL301 only advises and changes nothing.

Looking is bounded (depth, number of objects), copies nothing and calls no
``__getitem__``: it follows instance attributes, slots, lists, tuples and
dict values, which covers TensorDataset, ConcatDataset, Subset and
ChainDataset.
"""

from .. import objwalk
from . import rule

GROUP = "dataloader"

# Device types whose tensors cannot be handed to a DataLoader worker.
ACCELERATORS = frozenset(("cuda", "mps", "xpu", "hpu", "npu", "mtia", "xla",
                          "privateuseone"))
# Device types whose tensors spawn/forkserver workers receive by IPC.
IPC_SHAREABLE = frozenset(("cuda",))
MAX_DEPTH = 8
MAX_OBJECTS = 20_000
# How many moved paths the log names before "and N more".
NAMED = 6

class Found:
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


class Scan:
    __slots__ = ("found", "complete")

    def __init__(self):
        self.found = []
        self.complete = True

    def on(self, devices):
        return [f for f in self.found if f.device_type in devices]


def _torch():
    import sys

    return sys.modules.get("torch")


def _children(obj, setters=True, items=None):
    """(label, child, setter) for what ``obj`` holds, from the shared walker's
    edges; setter None where the child cannot be replaced in place (a tuple
    item) or was not asked for. Dict keys and set members hold no tensor
    that could be moved in place: not followed."""
    for edge in objwalk.edges(obj, items):
        if edge.how in (edge.KEY, edge.MEMBER):
            continue
        yield edge.label(), edge.child, edge.set if setters and edge.settable else None


def _skip(obj, torch):
    if isinstance(obj, objwalk.ATOMIC) or isinstance(obj, objwalk.OPAQUE):
        return True
    if torch is not None and isinstance(obj, torch.nn.Module):
        return True  # a model is the program's, not the dataset's: never moved
    name = type(obj).__module__
    return name.startswith("numpy") or name.startswith("pandas")


def scan(root, max_depth=MAX_DEPTH, max_objects=MAX_OBJECTS, path="dataset",
         items=objwalk.SAMPLE_ITEMS):
    """The tensors reachable from ``root``, bounded; nothing copied or called.

    Looks at ``items`` items per container (all the parts of a ConcatDataset);
    ``relocate`` passes None to find every tensor it moves.
    """
    torch = _torch()
    result = Scan()
    if torch is None:
        return result
    parts = _parts(root, torch)
    seen = set()
    budget = [max_objects]

    def visit(obj, label, depth, part):
        if id(obj) in seen:
            return
        if budget[0] <= 0:
            result.complete = False
            return
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            budget[0] -= 1
            result.found.append(Found(label, obj, part))
            return
        if _skip(obj, torch):
            return
        if depth >= max_depth:
            result.complete = False
            return
        budget[0] -= 1
        sample = None if obj is parts else items
        for i, (sub, child, _setter) in enumerate(_children(obj, False, sample)):
            if budget[0] <= 0:
                result.complete = False
                break
            if parts is not None and obj is parts:
                visit(child, label + sub, depth + 1, i)
            else:
                visit(child, label + sub, depth + 1, part)

    visit(root, path, 0, None)
    return result


def _parts(root, torch):
    """The list of parts of a ConcatDataset/ChainDataset at the top (through Subsets)."""
    data = torch.utils.data
    node = root
    for _ in range(8):
        if isinstance(node, data.Subset):
            node = node.dataset
            continue
        break
    if isinstance(node, (data.ConcatDataset, data.ChainDataset)):
        parts = node.datasets
        return parts if isinstance(parts, (list, tuple)) else None
    return None


def tensor_to_cpu(t):
    out = t.detach().to("cpu")
    if t.requires_grad and t.is_leaf:
        out.requires_grad_(True)
    return out


def storage_to_cpu(storage):
    return storage.cpu()


def relocate(root, devices=None, max_depth=MAX_DEPTH):
    """Move every tensor on ``devices`` under ``root`` to CPU, in place.

    Returns (new root, moved Found list). The root changes only when it is
    itself a tensor or a tuple; everything below is replaced where it is
    held (lists, dicts, attributes; tuples are rebuilt and put back in
    their owner). Identity is kept: one tensor object becomes one CPU tensor
    wherever it is referenced, and tensors that view one storage become
    views of one CPU copy of it. The depth bound is the scan's; the object
    bound is lifted, so that what is moved is everything the depth reaches.
    """
    torch = _torch()
    found = scan(root, max_depth=max_depth, max_objects=10 ** 9, items=None).on(
        ACCELERATORS if devices is None else devices)
    if not found:
        return root, []
    # Tensors sharing one storage: copy the storage once, rebuild the views.
    by_storage = {}
    for f in found:
        by_storage.setdefault(_storage_key(f.tensor), []).append(f.tensor)
    new = {}
    for group in by_storage.values():
        distinct = {id(t): t for t in group}
        if len(distinct) == 1:
            t = group[0]
            new[id(t)] = tensor_to_cpu(t)
            continue
        cpu_storage = storage_to_cpu(group[0].untyped_storage())
        for t in distinct.values():
            view = torch.empty((0,), dtype=t.dtype).set_(
                cpu_storage, t.storage_offset(), t.size(), t.stride())
            if t.requires_grad and t.is_leaf:
                view.requires_grad_(True)
            new[id(t)] = view

    done = {}

    def fix(obj, depth):
        """The object to hold instead of ``obj`` (itself when unchanged)."""
        key = id(obj)
        if key in new:
            return new[key]
        if key in done:
            return done[key]
        if isinstance(obj, torch.Tensor) or _skip(obj, torch) or depth >= max_depth:
            return obj
        done[key] = obj  # cycles: the object itself while it is being fixed
        if isinstance(obj, tuple):
            items = [fix(x, depth + 1) for x in obj]
            if any(a is not b for a, b in zip(items, obj)):
                rebuilt = type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
                done[key] = rebuilt
                return rebuilt
            return obj
        for _label, child, setter in _children(obj):
            replacement = fix(child, depth + 1)
            if replacement is not child and setter is not None:
                setter(replacement)
        return obj

    return fix(root, 0), found


def _storage_key(t):
    try:
        return ("storage", t.untyped_storage()._cdata)
    except Exception:
        return ("tensor", id(t))


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


def _start_method(values, facts):
    context = values.get("multiprocessing_context")
    if context is None:
        return facts.start_method
    from ..facts import effective_start_method

    return effective_start_method(context)


def _move(values, found):
    """The side effect: relocate the dataset's tensors (fix mode only)."""
    def apply():
        root, _moved = relocate(values["dataset"], devices={f.device_type for f in found})
        if root is not values["dataset"]:
            values["dataset"] = root  # a bare tensor or tuple as the dataset
    return apply


def _root_change(values, before, after):
    """A bare tensor (or tuple) as the dataset is replaced, not changed in place.

    ``apply`` then puts the CPU one into ``values`` (the checks' working
    arguments), and naming ``dataset`` here makes the wrapper pass it on.
    """
    root = values["dataset"]
    torch = _torch()
    if isinstance(root, tuple) or (torch is not None and isinstance(root, torch.Tensor)):
        before = dict(before, dataset="<%s>" % type(root).__name__)
        after = dict(after, dataset=root)
    return before, after


def device_tensors_possible(facts):
    """No usable accelerator, no device tensor: the scan is skipped (the
    common CPU case pays nothing per DataLoader)."""
    return facts.accelerator is not None or facts.cuda_initialized


def _plan_workers(values, facts):
    """(found accelerator tensors, whether DL301 moves them) for this loader."""
    if values["num_workers"] <= 0 or not device_tensors_possible(facts):
        return [], False
    found = scan(values["dataset"]).on(ACCELERATORS)
    if not found:
        return [], False
    spawnish = _start_method(values, facts) in ("spawn", "forkserver")
    shareable = all(f.device_type in IPC_SHAREABLE for f in found)
    return found, not (spawnish and shareable) or batch_device(values["dataset"]) is not None


def batch_device(dataset):
    """The one device every batch of ``dataset`` is on, where that is certain.

    A TensorDataset (alone, or in Subset/ConcatDataset) whose tensors all sit
    on one accelerator yields samples made only of those tensors, so each
    batch is wholly on that device: after the move to CPU, the loader can
    copy each batch back, and the script sees the very batches it had.
    Other datasets may mix devices within a sample: None.
    """
    from torch.utils.data import ConcatDataset, Subset, TensorDataset

    pending, devices = [dataset], set()
    while pending:
        part = pending.pop()
        if isinstance(part, Subset):
            pending.append(part.dataset)
        elif isinstance(part, ConcatDataset):
            pending.extend(part.datasets)
        elif isinstance(part, TensorDataset):
            devices.update(t.device for t in part.tensors)
        else:
            return None
    if len(devices) != 1:
        return None
    (device,) = devices
    return str(device) if device.type in ACCELERATORS else None


def _pin(values, facts):
    if facts.accelerator == "cuda" and not values["pin_memory"]:
        return {"pin_memory": values["pin_memory"]}, {"pin_memory": True}
    return {}, {}


@rule("DL301", "accelerator-tensors-in-workers", GROUP,
      "dataset holds CUDA/MPS/XPU tensors and num_workers > 0: move them to CPU "
      "in place (pin_memory on with CUDA); a one-device TensorDataset's batches are "
      "copied back to its device",
      "fork: 'RuntimeError: Cannot re-initialize CUDA in forked subprocess' or "
      "'CUDA error: initialization error' in the worker; MPS/XPU tensors cannot be "
      "sent to workers; spawn: one CUDA context per worker",
      "keep datasets on CPU and move each batch: "
      "batch.to(device, non_blocking=True) with pin_memory=True")
def accelerator_tensors_in_workers(values, facts, defaults):
    found, move = _plan_workers(values, facts)
    if not found:
        return None
    where = describe(found)
    if not move:
        # Works as it is (CUDA IPC); moving would change the batches' device.
        return accelerator_tensors_in_workers.rule.finding(
            {}, {}, "left on the device: %s. Under %s, workers receive CUDA tensors "
            "through CUDA IPC, which works at the cost of one CUDA context per worker; "
            "moving them would change the device of every batch" % (
                where, _start_method(values, facts)), strategy="advice only")
    before, after = _pin(values, facts)
    before, after = _root_change(values, before, after)
    device = batch_device(values["dataset"])
    if device is not None:
        before["batch_device"], after["batch_device"] = None, device
        arrive = "each batch is copied back to %s, as it was" % device
    else:
        arrive = "batches now arrive on CPU%s" % (
            " in pinned memory" if after or values["pin_memory"] else "")
    return accelerator_tensors_in_workers.rule.finding(
        before, after, "moved to CPU: %s. Worker processes under %s %s them; %s" % (
            where, _start_method(values, facts),
            "would each need a CUDA context for" if _start_method(values, facts) in (
                "spawn", "forkserver") else "cannot use", arrive),
        strategy="move to CPU", apply=_move(values, found))


@rule("DL302", "datasets-on-different-devices", GROUP,
      "the datasets of one loader (ConcatDataset, ChainDataset parts) are on "
      "different devices: move the accelerator parts to CPU",
      "RuntimeError: Expected all tensors to be on the same device, but found at "
      "least two devices, cpu and cuda:0! (in collate, even with num_workers=0)",
      "put every part of a ConcatDataset on the same device (CPU), and move "
      "batches with .to(device)")
def datasets_on_different_devices(values, facts, defaults):
    if not device_tensors_possible(facts) or _parts(values["dataset"], _torch()) is None:
        return None  # only the parts of a ConcatDataset/ChainDataset can differ
    found, moved = _plan_workers(values, facts)
    if moved:
        return None  # DL301 moves them all
    if values["batch_size"] is None and values["batch_sampler"] is None:
        return None  # no collation of samples into one batch
    if not _default_collate(values["collate_fn"]):
        return None  # a collate_fn of the user's may move samples itself
    result = scan(values["dataset"])
    per_part = {}
    for f in result.found:
        if f.part is not None:
            per_part.setdefault(f.part, set()).add(f.device)
    kinds = {frozenset(devices) for devices in per_part.values()}
    if len(kinds) < 2 or any(len(k) > 1 for k in kinds):
        return None  # one device for all, or parts that mix devices themselves
    devices = sorted(set().union(*kinds))
    off_cpu = [f for f in result.found if f.part is not None and f.device_type != "cpu"]
    if not off_cpu:
        return None
    before, after = _pin(values, facts)
    before, after = _root_change(values, before, after)
    return datasets_on_different_devices.rule.finding(
        before, after, "parts on %s would be stacked into one batch; moved to CPU: %s"
        % (", ".join(devices), describe(off_cpu)),
        strategy="move to CPU", apply=_move(values, off_cpu))


def _default_collate(fn):
    if fn is None:
        return True
    try:
        from torch.utils.data import default_collate
    except ImportError:
        return False
    return fn is default_collate


CHECKS = (accelerator_tensors_in_workers, datasets_on_different_devices)
