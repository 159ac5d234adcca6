"""Accelerator tensors held by a dataset (DL301, DL302: their ``prevents``
say what fails without them).

Every decision keeps the batches' device (DL301's summary says which);
moving in place keeps a tensor referenced twice one tensor and views of one
storage views of one CPU storage, and CUDA's ``pin_memory`` makes the copy
back fast. Looking (``inspection.tensors``) is bounded, copies nothing and
calls no ``__getitem__``; moving (``remedies.relocate``) is fix mode's only.
"""

import sys

from ..inspection.objwalk import is_a
from ..inspection.tensors import ACCELERATORS, batch_device, dataset_parts, describe, scan
from ..loaderstate import Kept
from . import number_of, rule
from .fork_plan import start_method
from .ladder import GROUP, emulated_workers

IPC_SHAREABLE = frozenset(("cuda",))  # spawn/forkserver workers receive these by IPC


def _move_to_cpu(found):
    """A dataset that is itself a tensor (or a tuple) is returned as the new
    ``dataset`` argument, not changed in place."""
    devices = {f.device_type for f in found}

    def move_to_cpu(args):
        from ..remedies.relocate import relocate  # noqa: PLC0415 - imports torch (torch_private): the rules load at `import cv2`, before the program imports torch

        root, _moved = relocate(args["dataset"], devices=devices)
        return {"dataset": root} if root is not args["dataset"] else None

    return move_to_cpu


def device_tensors_possible(facts):
    """Whether a device tensor can exist now: a CUDA tensor only once CUDA was
    initialised here (making one initialises it), MPS and XPU ones (no such
    flag) wherever present. Else no scan: a CPU machine, and a GPU one before
    the script first used CUDA, pay nothing per DataLoader."""
    return facts.cuda_initialized or facts.accelerator not in (None, "cuda")


MOVE, EMULATE = "move", "emulate"


def _plan_workers(values, facts):
    """(found accelerator tensors, what DL301 does: ``MOVE``, ``EMULATE`` or
    None, the batches' one device or None)."""
    found = values["num_workers"] > 0 and device_tensors_possible(facts) \
        and scan(values["dataset"]).on(ACCELERATORS)
    if not found:
        return [], None, None
    device = batch_device(values["dataset"])
    if device is not None:
        return found, MOVE, device
    if all(f.device_type in IPC_SHAREABLE for f in found):
        return found, None, None
    return found, EMULATE, None


def _pin(values, facts):
    if facts.accelerator == "cuda" and not values["pin_memory"]:
        return {"pin_memory": values["pin_memory"]}, {"pin_memory": True}
    return {}, {}


@rule("DL301", "accelerator-tensors-in-workers", GROUP,
      summary=("dataset holds CUDA/MPS/XPU tensors and num_workers > 0, one decision that "
               "keeps the batches' device: a one-device TensorDataset moves to CPU in "
               "place (pin_memory on with CUDA) and its batches are copied back; other "
               "CUDA tensors stay (CUDA IPC under spawn, DL205 under fork); MPS/XPU "
               "tensors get emulated workers"),
      prevents=("fork: 'RuntimeError: Cannot re-initialize CUDA in forked subprocess' or "
                "'CUDA error: initialization error' in the worker; MPS/XPU tensors "
                "cannot be sent to workers; spawn: one CUDA context per worker"),
      fix=("keep datasets on CPU and move each batch: batch.to(device, "
           "non_blocking=True) with pin_memory=True"),
      example=(("ds = TensorDataset(x.cuda(), y.cuda())\n"
                "DataLoader(ds, num_workers=2)"),
               ("ds = TensorDataset(x, y)                      # on CPU\n"
                "for xb, yb in DataLoader(ds, num_workers=2, pin_memory=True):\n"
                "    xb, yb = xb.cuda(non_blocking=True), yb.cuda(non_blocking=True)")),
      versions="every supported torch with an accelerator (CUDA, MPS, XPU)",
      at="dataloader.init",
      # it reads pin_memory, which DL105 may turn off
      after=("pin_memory_without_accelerator",))
def accelerator_tensors_in_workers(values, ctx):
    facts = ctx.facts
    found, how, device = _plan_workers(values, facts)
    if not found:
        return None
    where = describe(found)
    method = facts.start_method if values.get("multiprocessing_context") is None \
        else start_method(values)
    if how is None:
        if method not in ("spawn", "forkserver"):
            return None  # fork: nothing to say unless a worker touches them (DL205)
        return accelerator_tensors_in_workers.rule.finding(
            {}, {}, "left on the device: %s. Under %s, workers receive CUDA tensors "
            "through CUDA IPC, which works at the cost of one CUDA context per worker; "
            "moving them would change the device of every batch" % (where, method),
            strategy="advice only",
            done="%s left on the device: %s workers receive them through CUDA IPC" % (
                where, method))
    if how == EMULATE:
        return emulated_workers(
            accelerator_tensors_in_workers, values, "%s cannot be sent to worker "
            "processes; moved to CPU, the batches would change device" % where,
            reason="%s cannot reach worker processes" % where)
    before, changes = _pin(values, facts)
    before["batch_device"] = None
    return accelerator_tensors_in_workers.rule.finding(
        before, changes, "moved to CPU: %s. Worker processes under %s %s them; each "
        "batch is copied back to %s, as it was" % (
            where, method, "would each need a CUDA context for"
            if method in ("spawn", "forkserver") else "cannot use", device),
        strategy="move to CPU", kept=Kept(batch_device=device),
        remedies=[_move_to_cpu(found)],
        done="moved to CPU for %s: %s; batches copied back to %s" % (
            number_of(values["num_workers"], "worker"), where, device))


@rule("DL302", "datasets-on-different-devices", GROUP,
      summary=("the datasets of one loader (ConcatDataset, ChainDataset parts) are on "
               "different devices: move the accelerator parts to CPU"),
      prevents=("RuntimeError: Expected all tensors to be on the same device, but found "
                "at least two devices, cpu and cuda:0! (in collate, even with "
                "num_workers=0)"),
      fix=("put every part of a ConcatDataset on the same device (CPU), and move batches "
           "with .to(device)"),
      example=(("ds = ConcatDataset([TensorDataset(a), TensorDataset(b.cuda())])\n"
                "DataLoader(ds, batch_size=8)"),
               ("ds = ConcatDataset([TensorDataset(a), TensorDataset(b)])   # all on "
                "CPU\n"
                "for (xb,) in DataLoader(ds, batch_size=8):\n"
                "    xb = xb.to(device)")),
      versions="every supported torch with an accelerator",
      at="dataloader.init",
      # it reads pin_memory as DL301 left it; DL301 moves them all where it acts
      after=("accelerator_tensors_in_workers",))
def datasets_on_different_devices(values, ctx):
    facts = ctx.facts
    if not device_tensors_possible(facts) or \
            dataset_parts(values["dataset"], sys.modules.get("torch")) is None:
        return None  # only the parts of a ConcatDataset/ChainDataset can differ
    _found, how, _device = _plan_workers(values, facts)
    if how is not None:
        return None  # DL301 moves them all, or emulates the workers
    if values["batch_size"] is None and values["batch_sampler"] is None:
        return None  # no collation of samples into one batch
    if not default_collate(values["collate_fn"]):
        return None  # a collate_fn of the user's may move samples itself
    result = scan(values["dataset"])
    per_part: dict[int, set[str]] = {}
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
    before, changes = _pin(values, facts)
    return datasets_on_different_devices.rule.finding(
        before, changes, "parts on %s would be stacked into one batch; moved to CPU: %s"
        % (", ".join(devices), describe(off_cpu)),
        strategy="move to CPU", remedies=[_move_to_cpu(off_cpu)],
        done="moved to CPU, to be stacked with the other parts: %s" % describe(off_cpu))


def default_collate(fn):
    if fn is None:
        return True
    try:
        from torch.utils.data import default_collate  # noqa: PLC0415 - torch: the rules load at `import cv2`, before the program imports torch
    except ImportError:
        return False
    return fn is default_collate


@rule("DL305", "pin-accelerator-batch", GROUP,
      summary=("pin_memory=True and a batch that holds accelerator tensors (a dataset "
               "on the GPU, CUDA tensors from spawn workers): those tensors are handed "
               "on as they are, the rest of the batch pinned as asked"),
      prevents=("RuntimeError: cannot pin 'torch.cuda.FloatTensor' only dense CPU "
                "tensors can be pinned (at the first batch, with or without workers)"),
      fix=("pin_memory=False for data already on the GPU; or keep the dataset on CPU "
           "and move each batch with .to(device, non_blocking=True)"),
      example=(("ds = TensorDataset(x.cuda())\n"
                "DataLoader(ds, batch_size=32, pin_memory=True)"),
               ("ds = TensorDataset(x)                      # on CPU\n"
                "for (xb,) in DataLoader(ds, batch_size=32, pin_memory=True):\n"
                "    xb = xb.cuda(non_blocking=True)")),
      versions="every supported torch with CUDA",
      at="dataloader.pin")
def pin_accelerator_batch(args, ctx):
    """A tensor already on a device needs no pinning (a faster copy to one):
    only the tensor torch refused, the ``error`` pinning's own."""
    batch, torch = args["batch"], sys.modules.get("torch")
    if torch is None or not (is_a(batch, torch.Tensor) and batch.device.type != "cpu"
                             and "pinned" in str(args["error"])):
        return None
    return pin_accelerator_batch.rule.finding(
        {"pin_memory": True}, {"pin_memory": False},
        why="a %s tensor cannot be pinned (pinning is for a copy from the CPU), and is "
        "already on its device" % batch.device.type,
        strategy="left unpinned",
        done="batches hold %s tensors, which cannot be pinned: handed on as they are, "
        "the rest of each batch pinned" % batch.device.type)
