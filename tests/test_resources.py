"""DL303 (/dev/shm too small) and DL304 (open-file limit too low).

Unit tests give the rules injected facts; the behavioural tests make the
limits real: a private mount namespace with a small tmpfs on /dev/shm
(where the machine allows ``unshare -m``), and RLIMIT_NOFILE lowered in the
child before it starts.
"""

import random
import resource
import shutil
import subprocess
import sys

import pytest
import torch
from torch.utils.data import Dataset, IterableDataset, TensorDataset

from autosafe_torch.facts import Facts
from autosafe_torch.loaderstate import Kept
from autosafe_torch.remedies import limits
from autosafe_torch.rules import InitContext, resources
from autosafe_torch.rules.resources import open_file_limit_too_low, shm_too_small
from support import (PLATFORM_SIM, Result, assert_readable, clean_env, logged, once_per_run,
                     run_script, write_script)

MiB = 2 ** 20


def loader_values(dataset, **changes):
    values = dict(dataset=dataset, batch_size=1, shuffle=None, sampler=None,
                  batch_sampler=None, num_workers=0, collate_fn=None, pin_memory=False,
                  drop_last=False, timeout=0, worker_init_fn=None,
                  multiprocessing_context=None, generator=None, prefetch_factor=None,
                  persistent_workers=False, pin_memory_device="", in_order=True)
    values.update(changes)
    return values


DEFAULTS = {"prefetch_factor": None}


def ctx(facts):
    return InitContext(facts, defaults=DEFAULTS)


def mib_dataset(n=64, sample_mib=0.25):
    per = int(sample_mib * MiB) // 4
    return TensorDataset(torch.zeros(n, per))


# -- DL303, unit --------------------------------------------------------------

def test_shm_fits_nothing_fires():
    v = loader_values(mib_dataset(), batch_size=4, num_workers=2, prefetch_factor=2)
    assert shm_too_small(v, ctx(Facts(shm_available=64 * MiB))) is None


def test_shm_unknown_or_no_workers_nothing_fires():
    v = loader_values(mib_dataset(), batch_size=4, num_workers=2, prefetch_factor=4)
    assert shm_too_small(v, ctx(Facts(shm_available=None))) is None
    v0 = loader_values(mib_dataset(), batch_size=4)
    assert shm_too_small(v0, ctx(Facts(shm_available=1 * MiB))) is None


def test_shm_first_rung_lowers_prefetch_only():
    # batches of 1 MiB; 2 x 4 + 2 in flight, with headroom: 12.5 MiB > 8
    v = loader_values(mib_dataset(), batch_size=4, num_workers=2, prefetch_factor=4)
    f = shm_too_small(v, ctx(Facts(shm_available=8 * MiB)))
    assert f.after == {"prefetch_factor": 2}
    assert f.strategy == "lower prefetch_factor"
    assert "12.5 MiB" in f.why and "8.0 MiB is free" in f.why
    assert "--shm-size" in f.rule.fix and "--ipc=host" in f.rule.fix


def test_shm_second_rung_emulates_the_requested_workers():
    """Never fewer workers: the requested ones, emulated, with no shared memory."""
    v = loader_values(mib_dataset(), batch_size=4, num_workers=4, prefetch_factor=2)
    f = shm_too_small(v, ctx(Facts(shm_available=int(4.5 * MiB))))
    assert f.kept == Kept(emulated_workers=4) and "num_workers" not in f.after
    assert f.strategy == "emulated workers (in process)"
    assert f.done.startswith("4 workers emulated in this process, with the batches of real "
                             "ones: /dev/shm has 4.5 MiB free"), f.done


def test_shm_iterable_dataset_is_not_sampled():
    class Stream(IterableDataset):
        def __iter__(self):
            raise AssertionError("consumed")

    v = loader_values(Stream(), batch_size=4, num_workers=2, prefetch_factor=2)
    assert shm_too_small(v, ctx(Facts(shm_available=1024))) is None


class Lazy(Dataset):
    """Opens its 'file' on first use, and draws random numbers."""

    def __init__(self):
        self.handle = None
        self.fetches = 0

    def __len__(self):
        return 8

    def __getitem__(self, i):
        self.fetches += 1
        if self.handle is None:
            self.handle = object()
        return torch.rand(64 * 1024), random.random()


def test_no_user_code_runs_to_size_a_batch():
    """Sizing a batch never calls ``__getitem__`` (issue: a dataset that
    synchronizes across workers hangs, one that owns a random generator has
    its stream advanced): a dataset of the user's is not sampled, so DL303
    says nothing before the workers run, and the random state is untouched."""
    ds = Lazy()
    torch.manual_seed(0)
    random.seed(0)
    expected = (torch.rand(3), random.random())
    torch.manual_seed(0)
    random.seed(0)
    v = loader_values(ds, batch_size=4, num_workers=2, prefetch_factor=2)
    assert shm_too_small(v, ctx(Facts(shm_available=1 * MiB))) is None
    assert ds.fetches == 0 and ds.handle is None
    after = (torch.rand(3), random.random())
    assert torch.equal(after[0], expected[0]) and after[1] == expected[1]


def test_sample_profile_reads_shapes_of_tensor_dataset_without_indexing():
    ds = TensorDataset(torch.zeros(10, 3, 4), torch.zeros(10, dtype=torch.int64))
    p = resources.sample_profile(loader_values(ds))
    assert (p.nbytes, p.tensors) == (3 * 4 * 4 + 8, 2)


# -- DL304, unit --------------------------------------------------------------

def list_collate(batch):
    return [s[0].clone() for s in batch]


def fd_values(**changes):
    ds = TensorDataset(torch.zeros(640, 4))
    values = dict(batch_size=16, num_workers=2, collate_fn=list_collate, prefetch_factor=2)
    values.update(changes)
    return loader_values(ds, **values)


def test_fd_limit_raised_toward_hard_limit():
    f = open_file_limit_too_low(fd_values(), ctx(Facts(open_file_limit=(128, 20000),
                                                   sharing_strategy="file_descriptor")))
    assert f.strategy == "raise soft limit" and f.after == {}
    assert "Raised the soft limit to 20000" in f.why


def test_fd_hard_limit_too_low_switches_to_file_system_in_workers_too():
    import pickle

    f = open_file_limit_too_low(fd_values(), ctx(Facts(open_file_limit=(128, 128),
                                                   sharing_strategy="file_descriptor")))
    assert f.strategy == "file_system sharing"
    fn = f.after["worker_init_fn"]
    assert pickle.loads(pickle.dumps(fn)).args[0] == (limits.file_system_sharing,)


def test_fd_nothing_fires_when_enough_or_not_file_descriptor():
    facts = Facts(open_file_limit=(128, 20000), sharing_strategy="file_system")
    assert open_file_limit_too_low(fd_values(), ctx(facts)) is None
    facts = Facts(open_file_limit=(65536, 65536), sharing_strategy="file_descriptor")
    assert open_file_limit_too_low(fd_values(), ctx(facts)) is None
    # default collation: two stacked tensors per batch, 1024 is plenty
    v = fd_values(collate_fn=None)
    facts = Facts(open_file_limit=(1024, 1024), sharing_strategy="file_descriptor")
    assert open_file_limit_too_low(v, ctx(facts)) is None


def reference_batches(tmp_path_factory, body):
    """BATCHES of a run without the shim, where /dev/shm is large enough (once in
    the whole test run for each script)."""

    def batches():
        result = run_script(tmp_path_factory.mktemp("reference"), body)
        assert result.rc == 0 and result.batches, result
        return result.batches

    return once_per_run(tmp_path_factory, "resources-reference-" + body, batches)


# -- DL303, real: a small /dev/shm in a private mount namespace ---------------

def _private_shm_reason():
    if not sys.platform.startswith("linux"):
        return "not Linux"
    if shutil.which("unshare") is None:
        return "no unshare(1)"
    try:
        p = subprocess.run(["unshare", "-m", "sh", "-c",
                            "mount -t tmpfs -o size=1m tmpfs /dev/shm"],
                           capture_output=True, text=True, timeout=20)
    except Exception as exc:  # pragma: no cover
        return "unshare failed: %r" % exc
    if p.returncode != 0:
        return "no private mount namespace here (unshare -m needs CAP_SYS_ADMIN): %s" % (
            p.stderr.strip()[:200])
    return None


_SHM_REASON = _private_shm_reason()
needs_private_shm = pytest.mark.skipif(_SHM_REASON is not None, reason=str(_SHM_REASON))


def run_with_shm(tmp_path, body, size, activation):
    script = write_script(tmp_path, body, activation=activation)
    env = clean_env()
    env["PYTHONPATH"] = str(PLATFORM_SIM)
    cmd = "mount -t tmpfs -o size=%s tmpfs /dev/shm && exec %s %s" % (
        size, sys.executable, script)
    proc = subprocess.run(["unshare", "-m", "sh", "-c", cmd], cwd=str(tmp_path), env=env,
                          capture_output=True, text=True, timeout=120)
    assert_readable(proc.stderr)
    return Result(proc)


SHM_BODY = '''
import torch
from torch.utils.data import DataLoader, TensorDataset, default_collate

def augment(samples):
    """Per-worker random augmentation: batch i shows which worker's stream made it."""
    (x,) = default_collate(samples)
    return x + torch.rand(x.shape[0], 1)

if __name__ == "__main__":
    torch.manual_seed(0)
    ds = TensorDataset(torch.arange(64 * 65536, dtype=torch.float32).reshape(64, 65536))
    digest(DataLoader(ds, batch_size=4, num_workers=2, prefetch_factor={pf}, collate_fn={collate}))
'''


@needs_private_shm
@pytest.mark.parametrize("pf,size,collate,done", [
    (4, "8m", "None", "prefetch_factor 4 -> "),  # fewer in flight
    # not even one batch per worker fits: the requested workers, emulated
    (2, "3m", "augment", "2 workers emulated in this process")])
@pytest.mark.rule("DL303")
def test_small_dev_shm_fails_without_and_runs_with(tmp_path, tmp_path_factory, pf, size,
                                                   collate, done):
    """The batches are those of the requested workers on a large /dev/shm (with
    per-worker random augmentation, where fewer workers would change them)."""
    body = SHM_BODY.format(pf=pf, collate=collate)
    reference = reference_batches(tmp_path_factory, body)
    # Without the shim the loader fails (with augment, plain torch may hang after
    # the workers' errors instead: the loader without it shows the failure at once).
    without = run_with_shm(tmp_path, SHM_BODY.format(pf=pf, collate="None"), size, None)
    assert without.rc != 0, without
    # torch's words, in the main process or (when the main one loses the race) the worker's
    assert any(words in without.output for words in (
        "unable to allocate shared memory", "Bus error",
        "Unexpected bus error encountered in worker")), without
    with_ = run_with_shm(tmp_path, body, size, "import")
    assert with_.rc == 0, with_
    (rec,) = logged(with_.stderr, "DL303")
    assert rec.done.startswith(done) and "/dev/shm has" in rec.done, rec
    assert "--shm-size" in rec.fix
    assert with_.batches == reference


# -- DL304, real: a low RLIMIT_NOFILE -----------------------------------------

FD_BODY = '''
import resource, torch
from torch.utils.data import DataLoader, TensorDataset
def list_collate(batch):
    return [s[0].clone() for s in batch]
ds = TensorDataset(torch.arange(640 * 4, dtype=torch.float32).reshape(640, 4))
loader = DataLoader(ds, batch_size=16, num_workers=2, collate_fn=list_collate)
kept = list(loader)  # the program keeps every batch: one shared storage per sample
class Again:
    def __iter__(self):
        return iter(kept)
digest(Again())
print("LIMIT", resource.getrlimit(resource.RLIMIT_NOFILE),
      torch.multiprocessing.get_sharing_strategy())
'''


def run_with_nofile(tmp_path, soft, hard, activation):
    script = write_script(tmp_path, FD_BODY, activation=activation)
    env = clean_env()
    env["PYTHONPATH"] = str(PLATFORM_SIM)

    def lower():
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    proc = subprocess.run([sys.executable, str(script)], cwd=str(tmp_path), env=env,
                          capture_output=True, text=True, timeout=120, preexec_fn=lower)
    assert_readable(proc.stderr)
    return Result(proc)


def _hard_limit():
    return resource.getrlimit(resource.RLIMIT_NOFILE)[1]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="file_descriptor sharing")
@pytest.mark.parametrize("hard,done", [("high", "open-file soft limit 160 -> "),
                                       (160, "tensors shared through file_system")])
@pytest.mark.rule("DL304")
def test_low_open_file_limit_fails_without_and_runs_with(tmp_path, tmp_path_factory, hard,
                                                        done):
    if hard == "high":
        hard = _hard_limit()
        if hard != resource.RLIM_INFINITY and hard < 4096:
            pytest.skip("hard open-file limit %d is too low to raise toward" % hard)
    reference = reference_batches(tmp_path_factory,
                                  FD_BODY.replace("num_workers=2", "num_workers=0"))
    without = run_with_nofile(tmp_path, 160, hard, None)
    assert without.rc != 0, without
    assert "Too many open files" in without.output or "ancdata" in without.output
    with_ = run_with_nofile(tmp_path, 160, hard, "import")
    assert with_.rc == 0, with_
    (rec,) = logged(with_.stderr, "DL304")
    assert rec.done.startswith(done), rec
    assert with_.batches == reference
