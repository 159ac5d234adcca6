"""The private names of torch's DataLoader that the iterator supervisor and the
emulated workers build on, checked once per process before either is used.

torch keeps its iterator loop private, and a release may rename a method or
an attribute. Found missing, the seam is not used: the loader gets torch's
own iterator (no watch, no emulated workers), one line says why, and the
program runs as it would without autosafe_torch. Checked by name and shape
only (a method that exists, with the parameters we call it with; an
attribute that torch's ``__init__``/``_reset`` set), never by running torch.
"""

import inspect

# Methods of _MultiProcessingDataLoaderIter the supervisor calls or overrides,
# with the parameters it passes.
WATCHED_METHODS = {
    "_try_get_data": ("timeout",),
    "_get_data": (),
    "_process_data": ("data", "worker_idx"),
    "_shutdown_workers": (),
    "_reset": ("loader", "first_iter"),
    "_next_data": (),
    "_try_put_index": (),
}
# Attributes the supervisor reads, set by torch's iterators' __init__ or _reset.
WATCHED_ATTRIBUTES = ("_task_info", "_rcvd_idx", "_workers", "_worker_pids_set", "_pin_memory",
                      "_workers_status", "_timeout", "_num_yielded", "_sampler_iter",
                      "_index_sampler", "_base_seed")
# What the emulated workers take from torch: its base iterator's state, and the
# worker module's names for a worker's identity and seeds.
EMULATED_ATTRIBUTES = ("_dataset_kind", "_auto_collation", "_drop_last", "_collate_fn",
                       "_dataset", "_index_sampler", "_sampler_iter", "_num_yielded",
                       "_base_seed", "_pin_memory", "_num_workers", "_persistent_workers")
WORKER_MODULE = ("_worker_info", "WorkerInfo", "_generate_state",
                 "_IterableDatasetStopIteration", "HAS_NUMPY")
DATALOADER_MODULE = ("_BaseDataLoaderIter", "_MultiProcessingDataLoaderIter", "_DatasetKind",
                     "_sharding_worker_init_fn")

_checked = {}  # seam -> what is missing ("" where nothing is)


def watched_missing():
    """What the watched iterator needs that this torch lacks ("" where nothing)."""
    return _once("watched", _watched)


def emulated_missing():
    """What the emulated workers need that this torch lacks ("" where nothing)."""
    return _once("emulated", _emulated)


def _once(seam, check):
    if seam not in _checked:
        try:
            _checked[seam] = ", ".join(check())
        except Exception as exc:  # a torch we cannot even look at: not ours to use
            _checked[seam] = "torch.utils.data (%s)" % type(exc).__name__
    return _checked[seam]


def _watched():
    from torch.utils.data import dataloader
    from torch.utils.data._utils import signal_handling

    missing = _names(dataloader, DATALOADER_MODULE, "torch.utils.data.dataloader")
    missing += _names(signal_handling, ("_remove_worker_pids",), "signal_handling")
    cls = getattr(dataloader, "_MultiProcessingDataLoaderIter", None)
    if cls is None:
        return missing
    for name, params in WATCHED_METHODS.items():
        method = getattr(cls, name, None)
        if not callable(method) or not _takes(method, params):
            missing.append("%s.%s(%s)" % (cls.__name__, name, ", ".join(params)))
    missing += _set_by(cls, WATCHED_ATTRIBUTES)
    return missing


def _emulated():
    from torch.utils.data import dataloader
    from torch.utils.data._utils import worker

    missing = _names(dataloader, DATALOADER_MODULE, "torch.utils.data.dataloader")
    missing += _names(worker, WORKER_MODULE, "torch.utils.data._utils.worker")
    base = getattr(dataloader, "_BaseDataLoaderIter", None)
    if base is not None:
        missing += _set_by(base, EMULATED_ATTRIBUTES)
    return missing


def _names(module, names, shown):
    return ["%s.%s" % (shown, name) for name in names if not hasattr(module, name)]


def _takes(function, params):
    try:
        accepted = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return False
    return all(p in accepted for p in params)


def _set_by(cls, attributes):
    """``cls.attr`` for each attribute no ``__init__``/``_reset`` of ``cls`` or
    its bases names (a code object's names: what it reads and sets)."""
    named = set()
    for klass in cls.__mro__:
        for method in ("__init__", "_reset"):
            code = getattr(klass.__dict__.get(method), "__code__", None)
            if code is not None:
                named.update(code.co_names)
    return ["%s.%s" % (cls.__name__, a) for a in attributes if a not in named]
