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

Looking (``inspection.tensors``) is bounded, copies nothing and calls no
``__getitem__``; moving (``remedies.relocate``) happens in fix mode only.
"""

import sys

from ..inspection.tensors import ACCELERATORS, batch_device, dataset_parts, describe, scan
from . import number_of, rule

GROUP = "dataloader"

# Device types whose tensors spawn/forkserver workers receive by IPC.
IPC_SHAREABLE = frozenset(("cuda",))


def _start_method(values, facts):
    context = values.get("multiprocessing_context")
    if context is None:
        return facts.start_method
    from ..facts import effective_start_method

    return effective_start_method(context)



def _move_to_cpu(found):
    """The remedy: relocate the dataset's tensors on the devices in ``found``.

    A dataset that is itself a tensor (or a tuple) is replaced, not changed in
    place: the remedy returns it as the new ``dataset`` argument.
    """
    devices = {f.device_type for f in found}

    def move_to_cpu(args):
        from ..remedies.relocate import relocate

        root, _moved = relocate(args["dataset"], devices=devices)
        return {"dataset": root} if root is not args["dataset"] else None

    return move_to_cpu


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


def _pin(values, facts):
    if facts.accelerator == "cuda" and not values["pin_memory"]:
        return {"pin_memory": values["pin_memory"]}, {"pin_memory": True}
    return {}, {}


@rule("DL301", "accelerator-tensors-in-workers", GROUP,
      summary=("dataset holds CUDA/MPS/XPU tensors and num_workers > 0: move them to CPU "
               "in place (pin_memory on with CUDA); a one-device TensorDataset's batches "
               "are copied back to its device"),
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
      at="dataloader.init")
def accelerator_tensors_in_workers(values, ctx):
    facts = ctx.facts
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
                where, _start_method(values, facts)), strategy="advice only",
            done="%s left on the device: %s workers receive them through CUDA IPC" % (
                where, _start_method(values, facts)))
    before, changes = _pin(values, facts)
    state = {}
    device = batch_device(values["dataset"])
    if device is not None:
        before["batch_device"], state["batch_device"] = None, device
        arrive = "each batch is copied back to %s, as it was" % device
        landing = "batches copied back to %s" % device
    else:
        landing = "batches arrive on CPU"
        arrive = "batches now arrive on CPU%s" % (
            " in pinned memory" if changes or values["pin_memory"] else "")
    method = _start_method(values, facts)
    return accelerator_tensors_in_workers.rule.finding(
        before, changes, "moved to CPU: %s. Worker processes under %s %s them; %s" % (
            where, method, "would each need a CUDA context for"
            if method in ("spawn", "forkserver") else "cannot use", arrive),
        strategy="move to CPU", state=state, remedies=[_move_to_cpu(found)],
        done="moved to CPU for %s: %s; %s" % (
            number_of(values["num_workers"], "worker"), where, landing))


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
      at="dataloader.init")
def datasets_on_different_devices(values, ctx):
    facts = ctx.facts
    if not device_tensors_possible(facts) or \
            dataset_parts(values["dataset"], sys.modules.get("torch")) is None:
        return None  # only the parts of a ConcatDataset/ChainDataset can differ
    found, moved = _plan_workers(values, facts)
    if moved:
        return None  # DL301 moves them all
    if values["batch_size"] is None and values["batch_sampler"] is None:
        return None  # no collation of samples into one batch
    if not default_collate(values["collate_fn"]):
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
        from torch.utils.data import default_collate
    except ImportError:
        return False
    return fn is default_collate

