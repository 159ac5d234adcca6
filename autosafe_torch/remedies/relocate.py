"""Move a dataset's accelerator tensors to CPU, in place (DL301, DL302).

Every tensor object found is replaced by one CPU tensor, so a tensor
referenced twice stays one tensor, and views of one storage stay views of
one CPU storage.
"""

from typing import Any

import torch

from .. import torch_private as tp
from ..inspection import objwalk
from ..inspection.tensors import ACCELERATORS, never_entered, scan


def tensor_to_cpu(t):  # the copies: tests put their own in for meta tensors
    return t.detach().to("cpu")


def storage_to_cpu(storage):
    return storage.cpu()


def relocate(root, devices=None, max_depth=objwalk.MAX_DEPTH):
    """``(new root, moved HeldTensors)``: each tensor on ``devices`` under
    ``root`` replaced where it is held (a tuple rebuilt in its owner; the root
    changes only when it is a tensor or a tuple). The depth bound is the
    scan's; the object bound is lifted, so that everything it reaches moves."""
    found = scan(root, max_objects=10 ** 9, items=None).on(
        ACCELERATORS if devices is None else devices)
    if not found:
        return root, []
    # Tensors sharing one storage: copy the storage once, rebuild the views.
    by_storage: dict[Any, list[Any]] = {}
    for f in found:
        by_storage.setdefault(_storage_key(f.tensor), []).append(f.tensor)
    new = {}
    for group in by_storage.values():
        distinct = {id(t): t for t in group}
        cpu_storage = storage_to_cpu(group[0].untyped_storage()) if len(distinct) > 1 else None
        for t in distinct.values():
            view = tensor_to_cpu(t) if cpu_storage is None else torch.empty(
                (0,), dtype=t.dtype).set_(cpu_storage, t.storage_offset(), t.size(), t.stride())
            if t.requires_grad and t.is_leaf:
                view.requires_grad_(True)
            new[id(t)] = view

    done: dict[int, Any] = {}

    def fix(obj, depth):  # the object to hold instead of ``obj``
        key = id(obj)
        if key in new:
            return new[key]
        if key in done:
            return done[key]
        if isinstance(obj, torch.Tensor) or never_entered(obj, torch) or depth >= max_depth:
            return obj
        done[key] = obj  # cycles: the object itself while it is being fixed
        if isinstance(obj, tuple):
            items = [fix(x, depth + 1) for x in obj]
            if any(a is not b for a, b in zip(items, obj)):
                done[key] = type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
                return done[key]
            return obj
        for edge in objwalk.edges(obj):
            # Dict keys and set members hold no tensor that could be moved in place.
            if edge.how in (edge.KEY, edge.MEMBER):
                continue
            replacement = fix(edge.child, depth + 1)
            if replacement is not edge.child and edge.settable:  # not a tuple item
                edge.set(replacement)
        return obj

    return fix(root, 0), found


def _storage_key(t):
    try:
        return ("storage", tp.storage_id(t))
    except Exception:
        return ("tensor", id(t))

