"""DL301/DL302: accelerator tensors held by a dataset.

Without a GPU, "meta" tensors stand in for device tensors: they are real
torch.Tensors on a non-CPU device, so the scan (isinstance, ``.device``,
storages, views) and the in-place relocation run their real code; only the
copy itself is replaced (a meta tensor has no data to copy). Real CUDA runs
are marked ``gpu``.
"""

import collections
import pickle
import types

import pytest
import torch
from torch.utils.data import (ChainDataset, ConcatDataset, DataLoader, Dataset,
                              IterableDataset, Subset, TensorDataset)

from autosafe_torch.facts import Facts
from autosafe_torch.inspection import objwalk, tensors
from autosafe_torch.loaderstate import Kept
from autosafe_torch.remedies import batchdevice, relocate
from autosafe_torch.rules import Context, accel
from support import run_script


@pytest.fixture
def meta_is_accelerator(monkeypatch):
    """Treat meta as a device; 'copy' meta data to CPU as 7s (meta has none)."""
    for module in (accel, tensors, relocate):
        monkeypatch.setattr(module, "ACCELERATORS", frozenset({"meta"}))
    monkeypatch.setattr(accel, "device_tensors_possible", lambda facts: True)
    monkeypatch.setattr(relocate, "tensor_to_cpu",
                        lambda t: torch.full(t.shape, 7, dtype=t.dtype))
    monkeypatch.setattr(relocate, "storage_to_cpu",
                        lambda st: torch.UntypedStorage(st.nbytes()).fill_(7))


def apply(finding, args):
    """What the engine does with a finding in fix mode: run its remedies."""
    for remedy in finding.remedies:
        args.update(remedy(args) or {})


def meta(*shape):
    return torch.empty(*shape, device="meta")


def values(dataset, **changes):
    v = dict(dataset=dataset, batch_size=2, batch_sampler=None, num_workers=2,
             collate_fn=None, pin_memory=False, multiprocessing_context=None)
    v.update(changes)
    return v


class Holder(Dataset):
    __slots__ = ()

    def __init__(self, **attrs):
        self.__dict__.update(attrs)

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return self.x[i]


class Slotted:
    __slots__ = ("t",)


class Stream(IterableDataset):
    def __init__(self, t):
        self.t = t

    def __iter__(self):
        return iter(self.t)


def test_scan_finds_tensors_in_every_kind_of_holder():
    s = Slotted()
    s.t = meta(2)
    ds = ConcatDataset([
        TensorDataset(meta(4, 3), torch.zeros(4)),
        Subset(Holder(x=meta(4), items=[meta(1), (meta(2),)], table={"k": meta(3)}, s=s),
               [0, 1]),
    ])
    found = {f.path: (f.device, f.part) for f in tensors.scan(ds).found}
    assert found == {
        "dataset.datasets[0].tensors[0]": ("meta", 0),
        "dataset.datasets[0].tensors[1]": ("cpu", 0),
        "dataset.datasets[1].dataset.x": ("meta", 1),
        "dataset.datasets[1].dataset.items[0]": ("meta", 1),
        "dataset.datasets[1].dataset.items[1][0]": ("meta", 1),
        "dataset.datasets[1].dataset.table['k']": ("meta", 1),
        "dataset.datasets[1].dataset.s.t": ("meta", 1),
    }
    chain = ChainDataset([Stream(meta(3)), Stream(torch.zeros(3))])
    assert [(f.path, f.part) for f in tensors.scan(chain).found] == [
        ("dataset.datasets[0].t", 0), ("dataset.datasets[1].t", 1)]


def test_scan_is_bounded_and_skips_models():
    deep = cur = []
    for _ in range(objwalk.MAX_DEPTH):
        cur.append([])
        cur = cur[0]
    cur.append(meta(1))
    assert tensors.scan(Holder(x=deep)).complete is False
    many = Holder(x=[[meta(1)] for _ in range(50)])
    r = tensors.scan(many, max_objects=10)
    assert not r.complete and len(r.found) < 50
    assert tensors.scan(Holder(model=torch.nn.Linear(2, 2))).found == []


def test_relocation_in_place_keeps_aliasing_and_views(meta_is_accelerator):
    shared, base = meta(4, 3), meta(10)
    inner = Holder(x=shared, pair=(shared, base[:5]), views={"tail": base[5:]})
    ds = ConcatDataset([TensorDataset(shared, torch.zeros(4)), inner])
    root, moved = relocate.relocate(ds)
    assert root is ds and len({id(f.tensor) for f in moved}) == 3
    assert {f.device for f in tensors.scan(ds).found} == {"cpu"}
    x = ds.datasets[0].tensors[0]
    assert inner.x is x and inner.pair[0] is x  # one tensor, wherever it was held
    head, tail = inner.pair[1], inner.views["tail"]
    assert head.untyped_storage()._cdata == tail.untyped_storage()._cdata  # views of one copy
    assert (head.storage_offset(), tail.storage_offset()) == (0, 5)
    assert torch.all(x == 7)


def test_dl301_moves_with_workers_and_turns_pin_memory_on_with_cuda(meta_is_accelerator):
    ds = TensorDataset(meta(4, 3), meta(4))
    v = values(ds)
    f = accel.accelerator_tensors_in_workers(v, Context(Facts(start_method="fork",
                                                      accelerator="cuda")))
    assert f.after == {"pin_memory": True, "batch_device": "meta"}
    assert f.strategy == "move to CPU" and "copied back to meta" in f.why
    assert "dataset.tensors[0] (meta, 48 B)" in f.why
    assert ds.tensors[0].is_meta  # looking changed nothing
    apply(f, v)
    assert not ds.tensors[0].is_meta and not ds.tensors[1].is_meta
    assert accel.accelerator_tensors_in_workers(v, Context(Facts())) is None


def test_dl301_leaves_a_one_device_dataset_without_workers_alone(meta_is_accelerator):
    v = values(TensorDataset(meta(4, 3), meta(4)), num_workers=0)
    assert accel.accelerator_tensors_in_workers(v, Context(Facts())) is None
    assert accel.datasets_on_different_devices(v, Context(Facts())) is None


def test_dl301_under_spawn_moves_only_where_batches_can_go_back(meta_is_accelerator,
                                                                 monkeypatch):
    # CUDA tensors reach spawn workers through CUDA IPC: it works, at one CUDA
    # context per worker. A TensorDataset on one device is moved and its
    # batches copied back; any other dataset's batches could change device,
    # so it is only advised. (meta plays CUDA here.)
    monkeypatch.setattr(accel, "IPC_SHAREABLE", frozenset({"meta"}))
    v = values(Holder(x=meta(4, 3)), multiprocessing_context="spawn")
    f = accel.accelerator_tensors_in_workers(v, Context(Facts(start_method="fork")))
    assert f.strategy == "advice only" and f.after == {} and f.is_advice
    v = values(TensorDataset(meta(4, 3)), multiprocessing_context="spawn")
    f = accel.accelerator_tensors_in_workers(v, Context(Facts(start_method="fork")))
    assert f.strategy == "move to CPU" and f.after == {"batch_device": "meta"}


def test_dl301_keeps_the_batches_device_under_fork(meta_is_accelerator, monkeypatch):
    # One decision per loader, and the batches keep their device. CUDA tensors
    # (meta plays CUDA) under fork: left as they are, nothing said; a worker
    # that touches them is restarted by spawn (DL205, observed). Tensors that
    # reach no worker process (MPS, XPU: meta not shareable): emulated workers.
    v = values(Holder(x=meta(4, 3)), multiprocessing_context="fork")
    monkeypatch.setattr(accel, "IPC_SHAREABLE", frozenset({"meta"}))
    assert accel.accelerator_tensors_in_workers(v, Context(Facts(accelerator="cuda"))) is None
    assert v["dataset"].x.is_meta
    monkeypatch.setattr(accel, "IPC_SHAREABLE", frozenset())
    f = accel.accelerator_tensors_in_workers(v, Context(Facts(accelerator="mps")))
    assert f.strategy == "emulated workers (in process)" and not f.remedies
    assert f.kept == Kept(emulated_workers=2) and "dataset.x" in f.done
    assert accel.datasets_on_different_devices(v, Context(Facts(accelerator="mps"))) is None


def test_no_scan_where_no_device_tensor_can_exist(monkeypatch):
    """On a machine with no accelerator (and CUDA never initialised), a
    DataLoader(...) call pays nothing for DL301/DL302."""
    def no_scan(*a, **k):
        raise AssertionError("scanned")

    monkeypatch.setattr(accel, "scan", no_scan)
    cpu = Facts(start_method="fork", accelerator=None, cuda_initialized=False)
    v = values(ConcatDataset([TensorDataset(torch.zeros(4))] * 2))
    assert accel.accelerator_tensors_in_workers(v, Context(cpu)) is None
    assert accel.datasets_on_different_devices(v, Context(cpu)) is None


def test_batch_device_only_when_certain(meta_is_accelerator):
    on = TensorDataset(meta(4, 3), meta(4))
    assert tensors.batch_device(on) == "meta"
    assert tensors.batch_device(ConcatDataset([Subset(on, [0, 1]), on])) == "meta"
    assert tensors.batch_device(TensorDataset(meta(4), torch.zeros(4))) is None
    assert tensors.batch_device(TensorDataset(torch.zeros(4))) is None
    assert tensors.batch_device(Holder(x=meta(4))) is None


def test_batches_go_back_in_their_own_mapping_class():
    """A defaultdict batch (default_collate keeps the class) goes back to its
    device a defaultdict, its factory kept: its class takes no dict alone."""
    batch = collections.defaultdict(list, {"x": torch.zeros(2), "y": [torch.zeros(1)]})
    out = batchdevice.to_device(batch, "meta")
    assert type(out) is collections.defaultdict and out.default_factory is list
    assert out["x"].is_meta and out["y"][0].is_meta and not batch["x"].is_meta
    proxy = batchdevice.to_device(types.MappingProxyType({"x": torch.zeros(1)}), "meta")
    assert type(proxy) is types.MappingProxyType and proxy["x"].is_meta


def test_dl302_mixed_parts_without_workers(meta_is_accelerator):
    ds = ConcatDataset([TensorDataset(torch.zeros(4, 3)), TensorDataset(meta(4, 3))])
    v = values(ds, num_workers=0)
    f = accel.datasets_on_different_devices(v, Context(Facts(accelerator="cuda")))
    assert f.after == {"pin_memory": True}
    assert "cpu, meta" in f.why and "dataset.datasets[1].tensors[0]" in f.why
    assert accel.datasets_on_different_devices(
        values(ds, num_workers=0, collate_fn=lambda b: b), Context(Facts())) is None
    apply(f, v)
    assert not ds.datasets[1].tensors[0].is_meta


def test_through_the_dataloader_wrapper(meta_is_accelerator):
    """In this process, the real wrapper: found, moved in place, loader works."""
    ds = TensorDataset(meta(6, 2), meta(6))
    loader = DataLoader(ds, batch_size=3, num_workers=2)
    assert not ds.tensors[0].is_meta
    batches = list(loader)
    # moved to CPU for the workers, and each batch put back on its device
    assert len(batches) == 2 and batches[0][0].is_meta and batches[1][1].is_meta
    assert batches[0][0].shape == (3, 2)


def test_relocated_dataset_pickles_for_spawn(meta_is_accelerator):
    ds = TensorDataset(meta(4, 3))
    relocate.relocate(ds)
    again = pickle.loads(pickle.dumps(ds))
    assert torch.equal(again.tensors[0], ds.tensors[0])


# -- real CUDA (run on an accelerator machine) ---------------------------------

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

CUDA_WORKERS = '''
import torch
from torch.utils.data import DataLoader, TensorDataset
g = torch.Generator().manual_seed(0)
x = torch.randn(32, 3, generator=g).cuda()
y = torch.arange(32).cuda()
if __name__ == "__main__":
    digest(DataLoader(TensorDataset(x, y), batch_size=4, num_workers={workers}))
'''


@gpu
@needs_cuda
def test_cuda_dataset_with_fork_workers(tmp_path):
    reference = run_script(tmp_path, CUDA_WORKERS.format(workers=0))
    assert reference.rc == 0, reference
    body = CUDA_WORKERS.format(workers=2)
    without = run_script(tmp_path, body, start_method="fork")
    assert without.rc != 0
    assert "CUDA" in without.output and "initializ" in without.output
    with_ = run_script(tmp_path, body, activation="import", start_method="fork")
    assert with_.rc == 0, with_
    assert with_.batches == reference.batches


@gpu
@needs_cuda
def test_cuda_dataset_with_spawn_workers(tmp_path):
    reference = run_script(tmp_path, CUDA_WORKERS.format(workers=0))
    body = CUDA_WORKERS.format(workers=2)
    without = run_script(tmp_path, body, start_method="spawn")
    with_ = run_script(tmp_path, body, activation="import", start_method="spawn")
    assert with_.rc == 0, with_
    assert "DL301" in with_.stderr
    assert with_.batches == reference.batches
    if without.rc == 0:
        assert without.batches == reference.batches


CONCAT = '''
import torch
from torch.utils.data import ConcatDataset, DataLoader, TensorDataset
a = torch.arange(12, dtype=torch.float32).reshape(6, 2)
b = torch.arange(12, 24, dtype=torch.float32).reshape(6, 2)
b = b.cuda() if {cuda} else b
digest(DataLoader(ConcatDataset([TensorDataset(a), TensorDataset(b)]), batch_size=4))
'''


@gpu
@needs_cuda
def test_concat_of_cpu_and_cuda_parts(tmp_path):
    reference = run_script(tmp_path, CONCAT.format(cuda=False))
    assert reference.rc == 0, reference
    without = run_script(tmp_path, CONCAT.format(cuda=True))
    assert without.rc != 0 and "same device" in without.output
    with_ = run_script(tmp_path, CONCAT.format(cuda=True), activation="import")
    assert with_.rc == 0, with_
    assert "DL302" in with_.stderr
    assert with_.batches == reference.batches


# -- DL305: pinning a batch that holds accelerator tensors ----------------------

@pytest.mark.rule("DL305")
def test_dl305_pinning_hands_accelerator_tensors_on_as_they_are():
    """torch's own pin_memory, as the iterators and the pin thread call it, with
    meta tensors standing in for CUDA ones (torch refuses both in the same
    words): refused tensors go on as they are, once recorded; anything else
    torch raises stands."""
    from autosafe_torch import activation, report
    from torch.utils.data._utils import pin_memory as module

    if activation.is_active():
        activation.deactivate()
    batch = {"x": meta(4, 3), "y": [meta(4), "label"]}
    with pytest.raises(RuntimeError, match="only dense CPU tensors can be pinned"):
        module.pin_memory(batch)  # without the shim: torch's error
    activation.activate()
    out = module.pin_memory(batch)
    assert out["x"] is batch["x"] and out["y"][0] is batch["y"][0] and out["y"][1] == "label"
    (record,) = [i for i in report.interventions() if i.code == "DL305"]
    assert record.action == "fixed" and "meta tensors, which cannot be pinned" in record.done
    if not torch.cuda.is_available():
        # A CPU tensor that cannot be pinned here (no accelerator): torch's error, in
        # its words without the shim (2.13: no accelerator; a CUDA build of 2.0
        # without a driver: "CUDA driver version is insufficient ...").
        activation.deactivate()
        with pytest.raises(RuntimeError) as plain:
            module.pin_memory({"x": torch.zeros(2)})
        activation.activate()
        with pytest.raises(RuntimeError) as shimmed:
            module.pin_memory({"x": torch.zeros(2)})
        assert str(shimmed.value) == str(plain.value)
