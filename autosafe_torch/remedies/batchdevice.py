"""Batches copied back to the device their dataset was on (DL301) before its
tensors were moved to CPU for the workers. The iterator proxies torch's, so
that persistent workers (``_reset``) and everything else still work.
"""

import collections.abc
import copy

import torch
import wrapt


def to_device(data, device):
    if isinstance(data, torch.Tensor):
        return data.to(device, non_blocking=True)
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(to_device(x, device) for x in data))
    if isinstance(data, (list, tuple)):
        return type(data)(to_device(x, device) for x in data)
    if isinstance(data, collections.abc.Mapping):
        moved = {k: to_device(v, device) for k, v in data.items()}
        if isinstance(data, collections.abc.MutableMapping):  # as torch's collate does:
            clone = copy.copy(data)  # its class and state kept (a defaultdict, whose
            clone.update(moved)      # class cannot be built from a dict alone)
            return clone
        try:
            return type(data)(moved)  # type: ignore[call-arg]  # its class's; Mapping declares none
        except TypeError:  # a class not built from a dict: a dict, as torch's collate gives
            return moved
    return data


class BatchesTo(wrapt.ObjectProxy):
    def __init__(self, iterator, device):
        super().__init__(iterator)
        self._self_device = device

    def __iter__(self):
        return self

    def __next__(self):
        return to_device(next(self.__wrapped__), self._self_device)
