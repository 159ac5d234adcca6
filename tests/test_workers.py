"""DL104, DL201-DL207: worker hazards and the repair ladder, for real.

Each hazard runs in a subprocess with real workers under the start method
forced from outside (spawn = macOS/Windows, forkserver = Python 3.14 Linux,
fork = Linux): without autosafe_torch it fails (or gives wrong samples),
with it exit 0 and the batches equal those of a ``num_workers=0`` run. What
was done is read from the JSON log's record (code, action, strategy, call site,
what changed), each shown on stderr with its fix; the wording of the line is
tests/test_report.py's.
"""

import re
import subprocess
import sys
import textwrap

import pytest

from autosafe_torch import facts as facts_mod
from autosafe_torch.engine import run_checks
from autosafe_torch.inspection.mainmodule import guarded_lines
from autosafe_torch.rules import Context, IterContext
from autosafe_torch.rules import start_method as start_rules
from support import (LOCAL_OBJECT, PRELUDE, assert_readable, cannot_pickle, clean_env, json_log,
                     line_of, logged, once_per_run, one_of, run_script, shim_lines)

SPAWNING = ("spawn", "forkserver")
REOPEN = "repair: reopen read-only files by path in each worker"
FORK = "start method: fork"
EMULATED = "emulated workers (in process)"

DATA = '''
import os, sys, threading, time
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset
from worker_datasets import (FileDataset, GeneratorDataset, LockedDataset, LockedStream, PATH,
                             STRIDE)
'''


def loader_script(dataset, workers=2, guarded=True, extra="", epochs=1):
    call = "digest(DataLoader(%s, batch_size=4, num_workers=%d%s), epochs=%d)" % (
        dataset, workers, extra, epochs)
    if guarded:
        return DATA + "\nif __name__ == '__main__':\n    %s\n" % call
    return DATA + "\n" + call + "\n"


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """``reference(dataset, epochs=1)``: the known-safe batches: what the 2 workers
    asked for give under fork on Linux (for the file dataset, whose forked
    workers share one offset, num_workers=0, which gives the same batches as 2
    correct workers). Run once in the whole test run, for the datasets the tests use."""

    def batches(ds, epochs):
        workers = 0 if ds == "FileDataset()" else 2
        r = run_script(tmp_path_factory.mktemp("ref"),
                       loader_script(ds, workers=workers, epochs=epochs), start_method="fork")
        assert r.rc == 0 and r.batches, r
        return r.batches

    return lambda ds, epochs=1: once_per_run(
        tmp_path_factory, "workers-reference-%s-%d" % (ds, epochs), lambda: batches(ds, epochs))


def shimmed(tmp_path, body, start_method=None, env=None, **kw):
    """A run with the shim (AUTOSAFE_TORCH=1), and its JSON log's records; the
    result's ``call_site`` is the script's DataLoader line, as a record names it."""
    log = tmp_path / "log.jsonl"
    result = run_script(tmp_path, body, start_method=start_method, activation="env",
                        env=dict(env or {}, AUTOSAFE_TORCH_LOG_FILE=str(log)), **kw)
    result.call_site = "train.py:%d" % line_of(tmp_path, "digest(DataLoader(")
    return result, json_log(log)


def the_record(result, records, code, action="fixed"):
    """The one record of ``code``: made for the script's DataLoader line, with
    ``action``, and shown on stderr at that line with its fix below it."""
    mine = [r for r in records if r["code"] == code]
    assert len(mine) == 1, records
    record = mine[0]
    assert record["action"] == action, record
    assert record["call_site"] == result.call_site, record
    shown = logged(result.stderr, code)
    assert [r.site for r in shown] == [record["call_site"]] and shown[0].fix, result.stderr
    return record


@pytest.mark.parametrize("method", one_of(SPAWNING, 'spawn'))
def test_dl201_open_file_repaired_by_reopening(tmp_path, method, reference):
    body = loader_script("FileDataset()")
    bad = run_script(tmp_path, body, start_method=method)
    assert bad.rc != 0 and re.search(cannot_pickle("BufferedReader"), bad.stderr)
    good, records = shimmed(tmp_path, body, method)
    assert good.rc == 0, good
    assert good.batches == reference("FileDataset()")
    record = the_record(good, records, "DL201")
    assert record["strategy"] == REOPEN and record["before"] == {"files": ["dataset.f"]}, record
    assert record["after"] == {}, record  # the loader's arguments as they were


H5_SCRIPT = '''
import os, sys
import h5py, numpy as np, torch
from torch.utils.data import DataLoader, Dataset
HERE = os.path.dirname(os.path.abspath(sys.argv[0]))
PATH, LABELS = os.path.join(HERE, "data.h5"), os.path.join(HERE, "labels.h5")
if not os.path.exists(PATH):
    with h5py.File(PATH, "w") as f:
        f["x"] = np.arange(64, dtype=np.float32).reshape(32, 2)
    with h5py.File(LABELS, "w") as f:
        f["y"] = np.arange(32, dtype=np.int64) % 5

class H5Dataset(Dataset):
    """Two h5py datasets in two files: the line names both."""
    def __init__(self):
        self.x = h5py.File(PATH, "r")["x"]
        self.y = h5py.File(LABELS, "r")["y"]
    def __len__(self):
        return 32
    def __getitem__(self, i):
        return torch.from_numpy(self.x[i]), int(self.y[i])

if __name__ == "__main__":
    digest(DataLoader(H5Dataset(), batch_size=4, num_workers=WORKERS))
'''


def test_dl201_h5py_file_reopened_by_name(tmp_path):
    pytest.importorskip("h5py")
    bad = run_script(tmp_path, H5_SCRIPT.replace("WORKERS", "2"), start_method="spawn")
    assert bad.rc != 0 and "h5py objects cannot be pickled" in bad.stderr
    good, records = shimmed(tmp_path, H5_SCRIPT.replace("WORKERS", "2"), "spawn")
    ref = run_script(tmp_path, H5_SCRIPT.replace("WORKERS", "0"))
    assert good.rc == 0 and good.batches == ref.batches, good
    record = the_record(good, records, "DL201")
    assert record["strategy"] == REOPEN, record
    assert record["before"] == {"files": ["dataset.x", "dataset.y"]}, record  # both files


def test_a_program_that_takes_one_batch_still_gets_the_record(tmp_path):
    """PyTorch's test_worker_init_fn_forkserver: a local worker_init_fn under
    forkserver, one batch taken and the iterator dropped. The record is made
    once the workers showed the repair held, here when the iterator goes,
    before every worker delivered: never lost."""
    body = """
import multiprocessing, torch
from torch.utils.data import DataLoader, Dataset
class Seeds(Dataset):
    def __len__(self):
        return 4
    def __getitem__(self, i):
        return torch.initial_seed()
def main():
    def local_init_fn(worker_id):
        torch.manual_seed(12345)
    multiprocessing.set_start_method("forkserver", force=True)
    loader = DataLoader(Seeds(), batch_size=2, num_workers=2, worker_init_fn=local_init_fn)
    print("FIRST", next(iter(loader)).tolist())
if __name__ == "__main__":
    main()
"""
    plain = run_script(tmp_path, body)
    assert plain.rc != 0 and "Can't pickle local object" in plain.stderr, plain
    log = tmp_path / "log.jsonl"
    shim = run_script(tmp_path, body, activation="env", env={"AUTOSAFE_TORCH_LOG_FILE": str(log)})
    assert shim.rc == 0 and "FIRST [12345, 12345]" in shim.stdout, shim
    (record,) = json_log(log)
    assert (record["code"], record["action"], record["strategy"]) == ("DL202", "fixed",
                                                                       "by-value"), record
    assert list(record["before"]) == ["worker_init_fn"], record
    # made when the iterator starts: its line
    assert record["call_site"] == "train.py:%d" % line_of(tmp_path, "next(iter(loader))"), record
    assert [r.code for r in logged(shim.stderr)] == ["DL202"], shim.stderr


def test_h5py_under_fork_is_left_as_it_is(tmp_path):
    """Plain fork works with an h5py file opened in __init__ (HDF5 reads at explicit
    offsets; each worker's descriptor gets its own description at the kernel): the
    same batches, and no record."""
    pytest.importorskip("h5py")
    body = H5_SCRIPT.replace("WORKERS", "2")
    plain = run_script(tmp_path, body, start_method="fork")
    shim = run_script(tmp_path, body, start_method="fork", activation="env")
    assert plain.rc == 0 and shim.rc == 0 and shim.batches == plain.batches, shim
    assert not logged(shim.stderr), shim.stderr


@pytest.mark.parametrize("method", one_of(SPAWNING, 'forkserver'))
def test_dl201_fork_rung_when_repair_is_impossible(tmp_path, method, reference):
    body = loader_script("GeneratorDataset()")
    bad = run_script(tmp_path, body, start_method=method)
    assert bad.rc != 0 and "cannot pickle 'generator' object" in bad.stderr
    good, records = shimmed(tmp_path, body, method)
    assert good.rc == 0, good
    assert good.batches == reference("GeneratorDataset()")
    record = the_record(good, records, "DL201")
    assert record["strategy"] == FORK, record
    assert (record["before"], record["after"]) == ({"multiprocessing_context": method},
                                                   {"multiprocessing_context": "fork"}), record
    assert "dataset.gen" in record["why"], record  # what does not pickle, by its path


@pytest.mark.parametrize("method", one_of(SPAWNING, 'spawn'))
def test_dl201_emulated_workers_when_fork_is_unsafe(tmp_path, method, reference):
    body = loader_script("LockedDataset()", epochs=2)
    bad = run_script(tmp_path, body, start_method=method)
    assert bad.rc != 0 and "cannot pickle '_thread.lock' object" in bad.stderr
    good, records = shimmed(tmp_path, body, method)
    assert good.rc == 0, good
    assert good.batches == reference("LockedDataset()", epochs=2)
    record = the_record(good, records, "DL201")
    assert record["strategy"] == EMULATED and record["after"]["emulated_workers"] == 2, record
    # Its lock would travel as a new one; its live thread cannot.
    assert "dataset.refresher." in record["done"], record


def test_dl201_emulated_iterable_dataset_as_two_workers_give_it(tmp_path, reference):
    """An unsharded IterableDataset yields its stream once per worker: two
    emulated workers give it twice, as two forked workers do (num_workers=0,
    the seeds' fix, would give it once)."""
    body = loader_script("LockedStream()")
    bad = run_script(tmp_path, body, start_method="spawn")
    assert bad.rc != 0 and "cannot pickle '_thread.lock' object" in bad.stderr
    good, records = shimmed(tmp_path, body, "spawn")
    assert good.rc == 0, good
    assert good.batches == reference("LockedStream()")
    once = run_script(tmp_path, loader_script("LockedStream()", workers=0))
    assert once.batches != reference("LockedStream()")
    record = the_record(good, records, "DL201")
    assert record["strategy"] == EMULATED and record["after"]["emulated_workers"] == 2, record


@pytest.mark.parametrize("method", one_of(SPAWNING, 'forkserver'))
def test_dl202_lambda_collate_fn_by_value(tmp_path, method):
    body = DATA + textwrap.dedent('''
        def main():
            scale = 3
            ds = torch.arange(40.).reshape(20, 2)
            digest(DataLoader(ds, batch_size=4, num_workers=%d,
                              collate_fn=lambda b: torch.stack(b) * scale,
                              worker_init_fn=lambda wid: None))
        if __name__ == "__main__":
            main()
        ''')
    bad = run_script(tmp_path, body % 2, start_method=method)
    assert bad.rc != 0 and re.search(LOCAL_OBJECT + " 'main.<locals>.<lambda>'", bad.stderr)
    good, records = shimmed(tmp_path, body % 2, method)
    ref = run_script(tmp_path, body % 0)
    assert good.rc == 0, good
    assert good.batches == ref.batches
    # collate_fn and worker_init_fn: logged once for the call site, counted twice
    record = the_record(good, records, "DL202")
    assert record["strategy"] == "by-value" and list(record["before"]) == ["collate_fn"], record
    assert "summary: fixed DL202 x2" in good.stderr
    # spawn: the workers start warm as well (DL209, a clause of the same line)
    assert [r["strategy"] for r in records if r["code"] == "DL209"] == (
        ["warm forkserver"] if method == "spawn" else []), records


@pytest.mark.heavy
def test_dl202_lambda_behind_an_injected_worker_step(tmp_path):
    """cv2 imported: CV401/CV402 wrap the user's lambda worker_init_fn in a
    step of ours; the lambda inside still travels by value."""
    body = DATA + textwrap.dedent('''
        import cv2
        def main():
            seen = []
            ds = torch.arange(12.).reshape(6, 2)
            digest(DataLoader(ds, batch_size=2, num_workers=WORKERS,
                              worker_init_fn=lambda wid: seen.append(wid)))
        if __name__ == "__main__":
            main()
        ''')
    bad = run_script(tmp_path, body.replace("WORKERS", "2"), start_method="spawn")
    assert bad.rc != 0 and re.search(LOCAL_OBJECT, bad.stderr)
    good, records = shimmed(tmp_path, body.replace("WORKERS", "2"), "spawn")
    ref = run_script(tmp_path, body.replace("WORKERS", "0"))
    assert good.rc == 0 and good.batches == ref.batches, good
    record = the_record(good, records, "DL202")
    assert record["strategy"] == "by-value", record
    assert "DL201" not in {r["code"] for r in records} and "DL201" not in good.stderr


@pytest.mark.parametrize("method", one_of(SPAWNING, 'spawn'))
def test_dl203_class_from_interactive_main(tmp_path, method):
    body = PRELUDE + textwrap.dedent('''
        import torch
        from torch.utils.data import DataLoader, Dataset
        class Squares(Dataset):
            def __len__(self):
                return 20
            def __getitem__(self, i):
                return torch.tensor([i * i])
        digest(DataLoader(Squares(), batch_size=4, num_workers=WORKERS))
        ''')

    log = tmp_path / "log.jsonl"

    def run(workers, activate):
        env = clean_env({"AUTOSAFE_TEST_START_METHOD": method})
        env["PYTHONPATH"] = str(__import__("support").PLATFORM_SIM)
        if activate:
            env.update(AUTOSAFE_TORCH="1", AUTOSAFE_TORCH_LOG_FILE=str(log))
        proc = subprocess.run([sys.executable, "-c", body.replace("WORKERS", str(workers))],
                              env=env, capture_output=True, text=True, timeout=180, cwd=tmp_path)
        assert_readable(proc.stderr)
        return proc

    bad = run(2, False)
    assert bad.returncode != 0
    assert "Can't get attribute 'Squares' on <module '__main__'" in bad.stderr
    good, ref = run(2, True), run(0, False)
    assert good.returncode == 0, good.stderr
    digest = [line for line in good.stdout.splitlines() if line.startswith("BATCHES")]
    assert digest
    assert digest == [line for line in ref.stdout.splitlines() if line.startswith("BATCHES")]
    (record,) = [r for r in json_log(log) if r["code"] == "DL203"]
    at = body.splitlines().index("digest(DataLoader(Squares(), batch_size=4, num_workers=WORKERS))")
    # python -c: the line in the command
    assert record["call_site"] == "<string>:%d" % (at + 1), record
    assert (record["action"], record["strategy"]) == ("fixed", "by-value"), record
    assert record["before"] == {"class": "Squares at dataset"}, record
    (rec,) = logged(good.stderr, "DL203")
    assert rec.site == record["call_site"] and rec.fix, rec


@pytest.mark.parametrize("method", one_of(SPAWNING, 'forkserver'))
def test_dl204_unguarded_main(tmp_path, method, reference):
    body = loader_script("GeneratorDataset()", guarded=False)
    bad = run_script(tmp_path, body.replace("GeneratorDataset()", "torch.arange(8.)"),
                     start_method=method)
    assert bad.rc != 0 and "bootstrapping phase" in bad.stderr
    good, records = shimmed(tmp_path, body.replace("GeneratorDataset()", "torch.arange(8.)"),
                            method)
    ref = run_script(tmp_path, loader_script("torch.arange(8.)", workers=0))
    assert good.rc == 0, good
    assert good.batches == ref.batches
    record = the_record(good, records, "DL204")
    assert record["strategy"] == FORK, record
    assert (record["before"], record["after"]) == ({"multiprocessing_context": method},
                                                   {"multiprocessing_context": "fork"}), record


@pytest.mark.heavy
def test_dl204_script_from_stdin(tmp_path):
    """`python - < train.py`: spawn children try to run a file named '<stdin>'."""
    body = PRELUDE + "import torch\nfrom torch.utils.data import DataLoader\n" \
        "digest(DataLoader(torch.arange(8.), batch_size=2, num_workers=WORKERS))\n"

    def run(workers, activate):
        env = clean_env({"AUTOSAFE_TEST_START_METHOD": "spawn",
                         "PYTHONPATH": str(__import__("support").PLATFORM_SIM)})
        if activate:
            env["AUTOSAFE_TORCH"] = "1"
        proc = subprocess.run([sys.executable, "-"], input=body.replace("WORKERS", str(workers)),
                              env=env, capture_output=True, text=True, timeout=180, cwd=tmp_path)
        assert_readable(proc.stderr)
        return proc

    bad = run(2, False)
    assert bad.returncode != 0 and "No such file or directory" in bad.stderr
    good, ref = run(2, True), run(0, False)
    assert good.returncode == 0, good.stderr
    assert good.stdout == ref.stdout and "BATCHES" in ref.stdout
    (rec,) = logged(good.stderr, "DL204")
    assert rec.done.startswith("workers started by fork instead of spawn: "), rec


def test_dl207_shared_file_offset_under_fork(tmp_path, reference):
    body = loader_script("FileDataset(slow=0.01)", extra=", shuffle=False")
    ref = reference("FileDataset()")
    bad = run_script(tmp_path, body, start_method="fork")
    # wrong samples: silently, or read short and caught by collate
    assert bad.batches != ref or "stack expects each tensor to be equal size" in bad.stderr
    good, records = shimmed(tmp_path, body, "fork")
    assert good.rc == 0 and good.batches == ref, good
    record = the_record(good, records, "DL207")
    assert record["strategy"] == "own offset in each worker", record
    assert record["before"] == {"files": ["dataset.f"]}, record


WORKER_ARGS = DATA + textwrap.dedent('''
    import warnings
    warnings.simplefilter("error")  # an AssertionError or warning fails the run
    if __name__ == "__main__":
        for _ in sys.argv[1:]:
            digest(DataLoader(torch.arange(16.), batch_size=4, num_workers=1, prefetch_factor=0))
    ''')


@pytest.mark.parametrize("method", one_of(("fork",) + SPAWNING, 'fork'))
def test_dl106_zero_prefetch_with_workers(tmp_path, method):
    bad = run_script(tmp_path, WORKER_ARGS, start_method=method, args=("DL106",))
    assert bad.rc != 0 and "AssertionError" in bad.stderr, bad
    good, records = shimmed(tmp_path, WORKER_ARGS, method, args=("DL106", "again"))
    ref = run_script(tmp_path, DATA + "\nif __name__ == '__main__':\n"
                     "    for _ in range(2):\n"
                     "        digest(DataLoader(torch.arange(16.), batch_size=4))\n")
    assert good.rc == 0, good
    assert good.stdout == ref.stdout and ref.stdout.count("BATCHES") == 2
    record = the_record(good, records, "DL106")  # once for the line, run twice
    assert (record["before"], record["after"]) == ({"prefetch_factor": 0},
                                                   {"prefetch_factor": 2}), record


AUGMENTED_WORKERS = DATA + textwrap.dedent('''
    from torch.utils.data import get_worker_info

    class Augmented(Dataset):
        """Random augmentation and the worker id: the batches depend on the count."""
        def __len__(self):
            return 24
        def __getitem__(self, i):
            return torch.tensor([float(i), float(get_worker_info().id)]) + torch.rand(2)

    if __name__ == "__main__":
        torch.manual_seed(0)
        digest(DataLoader(Augmented(), batch_size=2, num_workers=3))
    ''')


@pytest.mark.parametrize("method", one_of(("fork",) + SPAWNING, 'fork'))
def test_dl104_too_many_workers_is_advice_only(tmp_path, method):
    """3 workers on 1 usable CPU: torch warns, and the batches depend on the
    worker count (seeds, get_worker_info). The shim changes nothing, torch's
    warning still reaches the user, and adds nothing to it (DL104 speaks only
    where torch cannot see the limit: a cgroup quota)."""
    env = {"AUTOSAFE_TEST_CPUS": "1"}
    plain = run_script(tmp_path, AUGMENTED_WORKERS, env=env, start_method=method)
    log = tmp_path / "log.jsonl"
    shimmed = run_script(tmp_path, AUGMENTED_WORKERS, start_method=method, activation="env",
                         env=dict(env, AUTOSAFE_TORCH_LOG_FILE=str(log)))
    warning = "This DataLoader will create 3 worker processes in total"
    assert plain.rc == 0 and warning in plain.stderr, plain
    assert shimmed.rc == 0 and warning in shimmed.stderr, shimmed
    assert shimmed.batches == plain.batches
    assert not log.exists(), log.read_text()


SAFE_LOADERS = DATA + textwrap.dedent('''
    from torch.utils.data import get_worker_info, SequentialSampler, RandomSampler

    class Sharded(IterableDataset):
        def __iter__(self):
            info = get_worker_info()
            wid, n = (info.id, info.num_workers) if info else (0, 1)
            return iter(range(wid, 20, n))

    def init(worker_id):
        torch.manual_seed(worker_id)

    def main():
        ds = torch.arange(40.).reshape(20, 2)
        g = torch.Generator().manual_seed(0)
        digest(DataLoader(ds, batch_size=3, num_workers=2))
        digest(DataLoader(ds, batch_size=3, num_workers=2, sampler=RandomSampler(ds, generator=g)))
        digest(DataLoader(Sharded(), batch_size=2, num_workers=2))
        digest(DataLoader(ds, batch_size=3, num_workers=2, worker_init_fn=init,
                          persistent_workers=True), epochs=2)
    if __name__ == "__main__":
        main()
    ''')


@pytest.mark.parametrize("method", one_of(("fork",) + SPAWNING, 'fork'))
def test_safe_loaders_are_untouched(tmp_path, method):
    """Differential: identical batches, and not a single intervention."""
    plain = run_script(tmp_path, SAFE_LOADERS, start_method=method)
    shimmed = run_script(tmp_path, SAFE_LOADERS, start_method=method, activation="env")
    assert plain.rc == 0 and shimmed.rc == 0, (plain, shimmed)
    assert plain.stdout == shimmed.stdout
    assert shim_lines(shimmed.stderr) == [], shimmed


def test_warn_mode_changes_nothing_and_strict_raises(tmp_path):
    body = loader_script("FileDataset()")
    warn, records = shimmed(tmp_path, body, "spawn", env={"AUTOSAFE_TORCH_MODE": "warn"})
    assert warn.rc != 0 and re.search(cannot_pickle("BufferedReader"), warn.stderr)
    record = the_record(warn, records, "DL201", action="would-fix")
    assert record["strategy"] == REOPEN and record["before"] == {"files": ["dataset.f"]}, record
    strict = run_script(tmp_path, body, start_method="spawn", activation="env",
                        env={"AUTOSAFE_TORCH_MODE": "strict"})
    assert strict.rc != 0 and "UnsafeCallError: train.py:%d: DL201 unpicklable-dataset: " \
        "refused (AUTOSAFE_TORCH_MODE=strict), not applied: dataset.f" % line_of(
            tmp_path, "digest(DataLoader(") in strict.stderr, strict
    assert "\n  fix: open files lazily" in strict.stderr


# -- the plan with injected facts: platforms and CUDA we do not have ----------

def plan(dataset, facts, method="fork"):
    """The findings of the iteration checks for a 2-worker loader, in this process."""
    args = {"num_workers": 2, "multiprocessing_context": method, "dataset": dataset,
            "collate_fn": None, "worker_init_fn": None, "timeout": 0}
    return run_checks("dataloader.iter", args, IterContext(facts, main_guarded=lambda: True))[0]


def _facts(**kw):
    return facts_mod.Facts(cpus_usable=8, **kw)


@pytest.fixture
def second_thread():
    """A thread of this process: macOS forks a single-threaded process safely,
    so a fork there is refused for a multi-threaded one (test_threads.py)."""
    import threading

    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    yield
    stop.set()
    thread.join()


def test_dl206_fork_on_macos_goes_to_spawn(second_thread):
    import torch

    found = plan(torch.arange(4.), _facts(platform="darwin"))
    # then started warm; what main() set carried (said once the workers tell it)
    assert [f.rule.code for f in found] == ["DL206", "DL220", "DL209"]
    assert found[0].after == {"multiprocessing_context": "spawn"}
    assert found[2].strategy == "warm forkserver"


def test_fork_is_not_chosen_on_macos_for_unpicklable_data(second_thread):
    found = plan((x for x in range(3)), _facts(platform="darwin"), method="spawn")
    assert found[0].rule.code == "DL201" and found[0].strategy == "emulated workers (in process)"


def test_dl104_always_advises():
    from torch.utils.data import IterableDataset

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(())

    quota = _facts().replace(cpus_usable=2, cpus_affinity=16)  # a container's CPU quota
    for dataset in (Stream(), [1, 2]):  # iterable or map-style: the count is the user's
        values = {"num_workers": 8, "dataset": dataset, "worker_init_fn": None}
        found = start_rules.too_many_workers(values, Context(quota))
        assert found.after == {} and found.strategy == "advice" and found.is_advice
    # torch warns itself where the affinity is the limit: nothing to add
    assert start_rules.too_many_workers(values, Context(quota.replace(cpus_affinity=2))) is None
    values["num_workers"] = 2
    assert start_rules.too_many_workers(values, Context(quota)) is None


def test_main_guard_detection(tmp_path):
    script = tmp_path / "m.py"
    script.write_text("import sys\nx = 1\nif __name__ == '__main__':\n    y = 2\n    z = 3\n")
    lines = guarded_lines(str(script))
    assert lines == {4, 5}


def test_a_repair_turned_off_leaves_torch_s_error():
    """With DL202 disabled, a lambda worker_init_fn under spawn is not taken down
    the ladder by DL201 either: the user turned that repair off, torch's error
    stands (PyTorch's test_worker_init_fn_forkserver passes with DL202 off)."""
    from autosafe_torch.config import CONFIG

    CONFIG.disabled = frozenset({"DL202"})
    args = {"num_workers": 2, "multiprocessing_context": "spawn",
            "dataset": [1, 2, 3], "collate_fn": None, "worker_init_fn": lambda i: None,
            "timeout": 0}
    found = run_checks("dataloader.iter", args,
                       IterContext(_facts(platform="linux"), main_guarded=lambda: True))[0]
    # only what main() set, carried beside what torch sends (said only where it differs)
    assert [f.rule.code for f in found] == ["DL220"] and found[0].told_by_workers
