"""DL205: fork workers after CUDA was initialised, observed, not predicted.

The ordinary GPU script initialises CUDA in the parent (``model.cuda()``)
and iterates fork workers that never touch it: PyTorch supports it, and the
shim must leave it alone (same batches, fork kept, nothing recorded). A
forked worker that does touch CUDA raises torch's "Cannot re-initialize
CUDA in forked subprocess": the workers are restarted by spawn, or emulated
where the dataset does not pickle, and resume at the first batch not
delivered, with the batches of a safe run (spawn, the start method torch's
error asks for).

Without a GPU, tests/platform_sim simulates CUDA initialised in the parent
(``AUTOSAFE_TEST_CUDA=initialised``): torch's own ``_lazy_init`` raises its
own error in a forked child. The same scenario runs on a real GPU (``gpu``).
"""

import pytest
import torch

from autosafe_torch import facts as facts_mod
from autosafe_torch.engine import run_checks
from autosafe_torch.inspection import failures
from autosafe_torch.rules import IterContext
from support import SCENARIOS, json_log, logged, once_per_run, run_scenario, shim_lines

SCENARIO = "cuda_workers.py"
SIMULATED = {"AUTOSAFE_TEST_CUDA": "initialised"}
TOUCH_LINE = "torch.cuda.init()"


def run(tmp_path, *args, shim=True, start_method="fork", env=None):
    log = tmp_path / ("log-%s.jsonl" % "-".join(args + (start_method,)))
    extra = dict(SIMULATED, **(env or {}))
    if shim:
        extra["AUTOSAFE_TORCH_LOG_FILE"] = str(log)
    result = run_scenario(tmp_path, SCENARIO, activation="env" if shim else None,
                          start_method=start_method, env=extra, args=args)
    return result, json_log(log) if shim else []


def pids(result):
    return int(result.stdout.split("PIDS ")[1].split()[0])


@pytest.fixture(scope="module")
def spawned(tmp_path_factory):
    """The safe run of a dataset whose workers touch CUDA: spawn, plainly (where
    they touch it does not change a sample); once in the whole test run."""

    def batches():
        result, _ = run(tmp_path_factory.mktemp("spawned"), "after:0", shim=False,
                        start_method="spawn")
        assert result.rc == 0 and result.batches, result
        return result.batches

    return once_per_run(tmp_path_factory, "cuda-workers-spawned", batches)


@pytest.mark.rule("DL205")
def test_healthy_gpu_script_keeps_fork_and_records_nothing(tmp_path):
    plain, _ = run(tmp_path, "never", shim=False)
    assert plain.rc == 0, plain
    shim, records = run(tmp_path, "never")
    assert shim.rc == 0, shim
    # Each sample says whether its worker inherited the parent's state: forked.
    assert shim.batches == plain.batches and pids(shim) == 2
    assert records == [] and shim_lines(shim.stderr) == []
    spawned_, _ = run(tmp_path, "never", shim=False, start_method="spawn")
    assert spawned_.batches != plain.batches  # the samples do tell fork from spawn


@pytest.mark.rule("DL205")
@pytest.mark.parametrize("touch, batch", [pytest.param("after:0", 0, marks=pytest.mark.heavy),
                                          ("after:8", 4)])
def test_worker_that_touches_cuda_restarts_by_spawn_exactly(tmp_path, spawned, touch, batch):
    plain, _ = run(tmp_path, touch, shim=False)
    assert plain.rc != 0
    assert "Cannot re-initialize CUDA in forked subprocess" in plain.stderr
    shim, records = run(tmp_path, touch)
    assert shim.rc == 0, shim
    # Real workers: 2 forked ones for the batches before the failure, 2 spawned.
    assert shim.batches == spawned and pids(shim) == (2 if batch == 0 else 4)
    (record,) = [r for r in records if r["code"] == "DL205"]
    assert record["strategy"] == "spawn workers" and record["action"] == "fixed"
    assert record["before"]["batch"] == batch, record  # resumed there
    assert record["after"] == {"rung": "spawn workers"}, record
    assert "Cannot re-initialize CUDA in forked subprocess" in record["before"]["status"], record
    assert record["fix"].startswith("keep CUDA out"), record
    (said,) = logged(shim.stderr, "DL205")
    # what the user reads on stderr: where the worker touched CUDA, and the fix
    assert _touch_site() in said.done and said.fix == record["fix"], said


@pytest.mark.rule("DL205")
@pytest.mark.parametrize("hold, rung", [
    ("stream", "spawn workers"),  # built again in each spawn worker (DL201)
    ("spent", "emulated workers (in process)")])  # changed after construction: no build gives it
def test_unpicklable_dataset_that_touches_cuda(tmp_path, spawned, hold, rung):
    plain, _ = run(tmp_path, "after:0", hold, shim=False)
    assert plain.rc != 0 and "Cannot re-initialize CUDA" in plain.stderr
    shim, records = run(tmp_path, "after:0", hold)
    assert shim.rc == 0, shim
    # The generator is in no sample: the batches are those of the spawn run.
    assert shim.batches == spawned and pids(shim) == (2 if hold == "stream" else 0)
    (record,) = [r for r in records if r["code"] == "DL205"]
    assert record["strategy"] == rung
    if hold == "stream":
        (repair,) = [r for r in records if r["code"] == "DL201"]
        assert repair["strategy"] == "repair: build the dataset again in each worker"


@pytest.mark.heavy
def test_disabled_dl205_leaves_torch_error(tmp_path):
    shim, records = run(tmp_path, "after:0", env={"AUTOSAFE_TORCH_DISABLE": "DL205"})
    assert shim.rc != 0 and "Cannot re-initialize CUDA in forked subprocess" in shim.stderr
    assert not [r for r in records if r["code"] == "DL205"]


def _touch_site():
    """``cuda_workers.py:N``: the scenario's line that touches CUDA."""
    for number, line in enumerate((SCENARIOS / SCENARIO).read_text().splitlines(), 1):
        if line.strip() == TOUCH_LINE:
            return "%s:%d" % (SCENARIO, number)
    raise AssertionError(TOUCH_LINE)


# -- the plan: nothing predicted; fork ruled out only once seen ------------------

def plan(dataset, fork_failed=None, method="fork"):
    args = {"num_workers": 2, "multiprocessing_context": method, "dataset": dataset,
            "collate_fn": None, "worker_init_fn": None, "timeout": 0}
    facts = facts_mod.Facts(cpus_usable=8, platform="linux", cuda_initialized=True)
    return run_checks("dataloader.iter", args, IterContext(facts, main_guarded=lambda: True,
                                                           fork_failed=fork_failed))[0]


def _touched():
    return failures.Failure(failures.CUDA, RuntimeError(
        "Cannot re-initialize CUDA in forked subprocess"), worker=0, pid=1)


@pytest.mark.rule("DL205")
def test_cuda_initialised_alone_changes_nothing():
    assert plan(torch.arange(4.)) == []


@pytest.mark.rule("DL205")
def test_once_a_forked_worker_touched_cuda_spawn_where_picklable():
    found = plan(torch.arange(4.), _touched())
    # then started warm; what main() set carried (said once the workers tell it)
    assert [f.rule.code for f in found] == ["DL205", "DL220", "DL209"]
    assert found[0].after == {"multiprocessing_context": "spawn"}
    assert "touched CUDA" in found[0].why


@pytest.mark.rule("DL205")
def test_once_a_forked_worker_touched_cuda_unpicklable_is_emulated():
    class Held(list):
        pass

    ds = Held([1, 2, 3])
    ds.stream = (x for x in range(3))  # a generator: it does not pickle
    found = plan(ds, _touched())
    assert found[0].rule.code == "DL205"
    assert found[0].strategy == "emulated workers (in process)"


def test_the_failure_kind_is_read_from_torch_words():
    for text in ("Caught RuntimeError in DataLoader worker process 0.\nOriginal Traceback "
                 "(most recent call last):\nRuntimeError: Cannot re-initialize CUDA in "
                 "forked subprocess. To use CUDA with multiprocessing, you must use the "
                 "'spawn' start method",
                 "CUDA error: initialization error\nCUDA kernel errors might be "
                 "asynchronously reported"):
        assert failures.exception_kind(RuntimeError(text)) == failures.CUDA
    assert failures.exception_kind(RuntimeError("CUDA out of memory")) is None


# -- on a real GPU (make gpu) ----------------------------------------------------

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@gpu
@needs_cuda
@pytest.mark.rule("DL205")
def test_real_gpu_healthy_script_keeps_fork(tmp_path):
    plain = run_scenario(tmp_path, SCENARIO, start_method="fork", args=("never",))
    shim = run_scenario(tmp_path, SCENARIO, activation="env", start_method="fork",
                        args=("never",))
    assert plain.rc == 0 and shim.rc == 0, (plain, shim)
    assert shim.batches == plain.batches and shim_lines(shim.stderr) == []


@gpu
@needs_cuda
@pytest.mark.rule("DL205")
def test_real_gpu_worker_calling_cuda_restarts_by_spawn(tmp_path):
    reference = run_scenario(tmp_path, SCENARIO, start_method="spawn", args=("after:8",))
    plain = run_scenario(tmp_path, SCENARIO, start_method="fork", args=("after:8",))
    shim = run_scenario(tmp_path, SCENARIO, activation="env", start_method="fork",
                        args=("after:8",))
    assert reference.rc == 0, reference
    assert plain.rc != 0 and "CUDA" in plain.stderr
    assert shim.rc == 0, shim
    assert shim.batches == reference.batches
    (said,) = logged(shim.stderr, "DL205")
    assert "touched CUDA" in said.done and "cuda_workers.py:" in said.done


# A dataset built on the GPU, a dict per sample; the loop uses each batch as it
# comes (the data "is already on the GPU"). The digest has each tensor's device.
GPU_HELD = '''
import torch
from torch.utils.data import DataLoader, Dataset

class OnGpu(Dataset):
    def __init__(self):
        self.stream = (i for i in range(3)) if {unpicklable} else None
        g = torch.Generator().manual_seed(0)
        self.items = [{{"x": torch.randn(3, generator=g).cuda(), "y": torch.tensor(i).cuda()}}
                      for i in range(32)]
    def __len__(self):
        return len(self.items)
    def __getitem__(self, i):
        return self.items[i]

if __name__ == "__main__":
    loader = DataLoader(OnGpu(), batch_size=4, num_workers={workers}, pin_memory={pin})
    model = torch.nn.Linear(3, 1).cuda()
    for batch in loader:
        model(batch["x"]).sum().backward()   # on the GPU, as it comes
    digest(loader)
'''


@gpu
@needs_cuda
@pytest.mark.rule("DL205", "DL301", "DL305")
@pytest.mark.parametrize("workers, pin, start_method, unpicklable", [
    (2, False, "fork", False), (2, True, "fork", False), (0, True, "fork", False),
    (2, True, "spawn", False), (2, True, "fork", True)])
def test_real_gpu_held_dataset_keeps_its_batches_devices(tmp_path, workers, pin,
                                                         start_method, unpicklable):
    """Every rung: fork recovered by spawn (CUDA IPC), spawn as asked, and emulated
    workers for a dataset that does not pickle (a generator beside its tensors)."""
    from support import run_script

    reference = run_script(tmp_path, GPU_HELD.format(workers=0, pin=False,
                                                     unpicklable=False))
    assert reference.rc == 0, reference
    body = GPU_HELD.format(workers=workers, pin=pin, unpicklable=unpicklable)
    plain = run_script(tmp_path, body, start_method=start_method)
    shim = run_script(tmp_path, body, activation="import", start_method=start_method)
    assert shim.rc == 0, shim
    assert shim.batches == reference.batches  # values and devices
    if plain.rc == 0:  # spawn without pinning works plainly: the same batches
        assert plain.batches == reference.batches
    if pin:
        assert logged(shim.stderr, "DL305")
