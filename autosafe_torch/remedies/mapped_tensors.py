"""Tensors whose storage lies in a file mapping, sent to spawn/forkserver
workers by reference (DL218): ``torch.load(path, mmap=True)``,
``torch.UntypedStorage.from_file``, ``torch.from_numpy`` of an ``np.memmap``.

Torch's reducer moves every CPU storage it sends into shared memory: the
file's bytes copied into ``/dev/shm`` for the tensor's life (the costs, and
the error where ``/dev/shm`` is small: DL218's rule); a ``from_file``
storage does not go at all (``OSError: [Errno 9] Bad file descriptor``).
Sent instead: the file's path and identity (device, inode, mtime, size),
where the storage lies in it, and the view. The worker maps the whole file
once, private and copy-on-write (as ``torch.load(mmap=True)`` does), and
rebuilds the view, a ``Parameter`` as a ``Parameter`` (as torch's
``rebuild_tensor``); views of one storage get one storage (torch 2.0, whose
storages take no safe weak reference: one each over the same bytes), each
file one map: the page cache holds its pages once.

Exact or nothing (``inspection/tensors.py``: ``reference``), else torch's
reducer, as for a file no tensor of a loader's parts lies in (DL218 names
those files). What differs (the rule's docs): each worker's tensor is its
private map, as a forked worker's, not memory shared with the training
process. The file is assumed not to change meanwhile (else
``MappedFileChanged``, loudly). Fail open: an error of ours while looking
sends the tensor torch's way.
"""

from __future__ import annotations

import contextlib
import functools
import mmap
import threading
import weakref
from multiprocessing.context import get_spawning_popen
from typing import Any

import torch

from .. import torch_private as tp
from ..inspection.mappings import Maps
from ..inspection.tensors import reference
from .memmaps import map_file
from .pickling import PROTOCOL, before_us, install, installed

_files: set[Any] = set()  # (device, inode): ``install_reducers``'s ``files``
_lock = threading.Lock()


# -- in the worker ------------------------------------------------------------------

# One map per file and one storage per storage sent, while a tensor uses them.
_maps: weakref.WeakValueDictionary[Any, Any] = weakref.WeakValueDictionary()
_storages: weakref.WeakValueDictionary[Any, Any] = weakref.WeakValueDictionary()


def mapped_tensor_again(cls, path, ident, offset, nbytes, dtype, size, stride,
                        storage_offset, requires_grad):
    storage = _storage(path, tuple(ident), offset, nbytes)
    t = torch.empty((0,), dtype=dtype).set_(storage, storage_offset, size, stride)
    if cls is torch.nn.Parameter:  # as torch's rebuild_tensor: integer tensors need it
        return torch.nn.Parameter(t, requires_grad=requires_grad)
    t.requires_grad = requires_grad
    return t


def _storage(path, ident, offset, nbytes):
    key = (path, ident, offset, nbytes)
    storage = _storages.get(key)
    if storage is None:
        whole = _maps.get((path, ident))
        if whole is None:
            whole = _maps[(path, ident)] = map_file(
                path, ident, 0, 0, mmap.ACCESS_COPY, "DL218", "changed after the training "
                "process sent a tensor mapped from it by reference")
        # The storage keeps its map alive (frombuffer holds the buffer's owner).
        storage = torch.frombuffer(whole, dtype=torch.uint8, count=nbytes,
                                   offset=offset).untyped_storage()
        if not tp.storages_keep_their_python_object():
            return storage  # torch 2.0: no safe weak reference, one each over the one map
        with contextlib.suppress(TypeError):  # storages that take no weak reference: one each
            _storages[key] = storage
    return storage


# -- in the training process ---------------------------------------------------------

def reduce_tensor(tensor, fallback):
    """WorkerPickler's reducer for tensors, else ``fallback`` (torch's)."""
    popen = get_spawning_popen()
    if popen is not None and _files:
        try:
            ref, _why = reference(tensor, _maps_while_starting(popen))
        except Exception:  # fail open: torch sends it as ever
            ref = None
        if ref is not None and ref.file in _files:
            return mapped_tensor_again, ref.args(type(tensor))
    return fallback(tensor) if fallback is not None else tensor.__reduce_ex__(PROTOCOL)


_starting: list[Any] = [None, None]  # a weak reference to the Popen being started, its Maps


def _maps_while_starting(popen):
    """The ``Maps`` of this process, read once per process start (a map made
    while the child's pickle is written is not in it): its pickling sends
    every tensor through the reducer."""
    with _lock:
        ref, maps = _starting
        if ref is not None and ref() is popen:
            return maps
        maps = Maps()
        with contextlib.suppress(TypeError):  # a Popen without weak references: read for each
            _starting[:] = [weakref.ref(popen), maps]
        return maps


def install_reducers(files=()):
    """Our reducer for the tensor types torch registers its own for, torch's
    the fallback; ``files``: ``(device, inode)`` of the files whose mapped
    tensors may go by reference (those a spawn loader's parts lie in)."""
    with _lock:
        _files.update(files)
    install({cls: functools.partial(reduce_tensor, fallback=before_us(cls))
             for cls in (torch.Tensor, torch.nn.Parameter)
             if getattr(installed(cls), "func", None) is not reduce_tensor})
