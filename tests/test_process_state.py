"""What main() set, every worker sees (DL220, issue 49).

tests/scenarios/process_state/: ordinary scripts whose ``main()`` sets what the
workers' code reads (a config dict from argparse, class statistics, a label
map a collate_fn reads, a seed worker_init_fn reads, a global a transform
reads, torch's default dtype, a library function replaced, a vocabulary a
``__setstate__`` reads, a large array, a connection that does not pickle).
The known-safe run is Linux's fork, without the shim. Plain spawn trains on
other data without a word (or fails); with the shim, under spawn, forkserver
(Python 3.14's default, rehearsed), as on macOS and as on Windows, the same
batches on real workers, and one record naming what was carried and the line
that reads it. Controls: a global no worker reads, the working directory and
``sys.path`` (spawn carries them): the same batches, no record.
"""

import pickle
import re
import sys

import numpy as np
import pytest
import torch

from support import SCENARIOS, json_log, once_per_run, one_of, rotated, run_scenario

from autosafe_torch.inspection import reads
from autosafe_torch.remedies import process_state

FOLDER = "process_state"
PLATFORMS = {"spawn": ("spawn", {}),
             "forkserver": ("forkserver", {"AUTOSAFE_TORCH_AS": "linux-py314"}),
             "macos": ("spawn", {"AUTOSAFE_TORCH_AS": "macos"}),
             "windows": ("spawn", {"AUTOSAFE_TORCH_AS": "windows"})}
# scenario -> the values its record names (label, and the text of the line that reads it)
CARRIED = {
    "module_dict": [("CONFIG", 'CONFIG["scale"]')],
    "class_stats": [("Spectra.mean", "self.mean"), ("Spectra.std", "self.mean")],
    "collate_labels": [("LABELS", "LABELS.get")],
    "init_seed": [("SEED", "SEED + worker_id")],
    "transform_global": [("JITTER", "JITTER *")],
    "default_dtype": [("torch's default dtype", None)],
    "replaced_function": [("colorsys.rgb_to_hsv", "colorsys.rgb_to_hsv((i")],
    "setstate_reads": [("VOCAB", "VOCAB.get")],
    "large_array": [("MEAN", "MEAN[i")],
}
CONTROLS = ("unread_global", "chdir_syspath")


def run(tmp_path, kind, platform=None, shim=True, start_method=None, args=()):
    method, env = PLATFORMS[platform] if platform else (start_method, {})
    log = tmp_path / "log.jsonl"
    env = dict(env, AUTOSAFE_TORCH_LOG_FILE=str(log)) if shim else env
    result = run_scenario(tmp_path, "%s/%s.py" % (FOLDER, kind),
                          activation="env" if shim else None, start_method=method, env=env,
                          args=args)
    return result, (json_log(log) if shim else [])


def safe(tmp_path_factory, kind, args=()):
    """The safe platform's batches (fork, no shim), once per test run."""
    def compute():
        result, _ = run(tmp_path_factory.mktemp("fork-" + kind), kind, shim=False,
                        start_method="fork", args=args)
        assert result.rc == 0 and result.batches, result
        return result.batches

    return once_per_run(tmp_path_factory, "process-state-fork-%s-%s" % (kind, args), compute)


def plain_spawn(tmp_path_factory, kind):
    def compute():
        result, _ = run(tmp_path_factory.mktemp("spawn-" + kind), kind, shim=False,
                        start_method="spawn")
        return {"rc": result.rc, "batches": result.batches, "stderr": result.stderr[-2000:]}

    return once_per_run(tmp_path_factory, "process-state-spawn-" + kind, compute)


def pids(result):
    return int(re.search(r"^PIDS (\d+)$", result.stdout, re.M).group(1))


def line_reading(kind, text):
    path = SCENARIOS / FOLDER / (kind + ".py")
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if text in line and not line.lstrip().startswith(("#", "def ")):
            return "%s.py:%d" % (kind, number)
    raise AssertionError("%r not in %s" % (text, path))


@pytest.mark.rule("DL220")
@pytest.mark.parametrize("kind, platform", rotated(sorted(CARRIED), sorted(PLATFORMS)))
def test_what_main_set_reaches_real_workers(tmp_path, tmp_path_factory, kind, platform):
    reference = safe(tmp_path_factory, kind)
    plain = plain_spawn(tmp_path_factory, kind)
    assert plain["rc"] != 0 or plain["batches"] != reference, \
        "plain spawn gives fork's batches: nothing to show"
    result, records = run(tmp_path, kind, platform)
    assert result.rc == 0 and result.batches == reference, result
    assert pids(result) == 4, result  # two real workers an epoch, not emulated ones
    (record,) = records
    assert record["code"] == "DL220" and record["action"] == "fixed", records
    expected = CARRIED[kind]
    assert [c["label"] for c in record["after"]["carried"]] == [label for label, _ in expected]
    for label, text in expected:
        shown = r"%s \(\S*/%s\)" % (re.escape(label), line_reading(kind, text)) if text \
            else re.escape(label)
        assert re.search(shown, record["done"]), record
    assert record["done"].startswith("main() set %d value" % len(expected)), record
    assert "carried to each of 2 workers" in record["done"]
    assert "summary: fixed DL220 x1" in result.stderr


@pytest.mark.rule("DL220")
@pytest.mark.parametrize("platform", one_of(sorted(PLATFORMS), "macos"))
def test_a_value_that_does_not_pickle_is_refused_loudly_never_left_at_the_default(
        tmp_path, tmp_path_factory, platform):
    """main() opens a connection into a global the workers read: plain spawn
    fails (None there); the shim cannot carry it, says so with the name and
    the line that reads it, and the next rung (emulated workers) gives the
    safe run's batches."""
    reference = safe(tmp_path_factory, "unpicklable")
    plain = plain_spawn(tmp_path_factory, "unpicklable")
    assert plain["rc"] != 0 and "'NoneType' object has no attribute 'execute'" in \
        plain["stderr"], plain
    result, records = run(tmp_path, "unpicklable", platform)
    assert result.rc == 0 and result.batches == reference, result
    assert pids(result) == 0, result  # emulated: this process's own value
    by_code = {r["code"]: r for r in records}
    words = r"DB \(\S*/%s\) cannot be carried to a spawned worker: it does not pickle" % (
        line_reading("unpicklable", "DB.execute"))
    assert by_code["DL220"]["action"] == "failed", records
    assert re.search(words, by_code["DL220"]["done"]), records
    assert by_code["DL216"]["action"] == "fixed" and re.search(words, by_code["DL216"]["done"])
    assert "emulated" in by_code["DL216"]["strategy"]
    assert by_code["DL216"]["fix"] == process_state.FIX


@pytest.mark.rule("DL220")
def test_a_library_function_replaced_by_one_no_worker_can_import_is_refused(
        tmp_path, tmp_path_factory):
    """main() puts a lambda in a library's place: carried by reference it cannot
    be, so the workers refuse, naming it, and emulated workers (which have it)
    give the safe run's batches."""
    reference = safe(tmp_path_factory, "replaced_function", ("lambda",))
    result, records = run(tmp_path, "replaced_function", "macos", args=("lambda",))
    assert result.rc == 0 and result.batches == reference and pids(result) == 0, result
    by_code = {r["code"]: r for r in records}
    assert by_code["DL220"]["action"] == "failed", records
    assert "colorsys.rgb_to_hsv (" in by_code["DL220"]["done"], records
    assert "cannot be carried to a spawned worker" in by_code["DL216"]["done"], records


@pytest.mark.parametrize("kind, platform", rotated(CONTROLS, sorted(PLATFORMS)))
def test_controls_are_left_alone(tmp_path, tmp_path_factory, kind, platform):
    """Nothing a worker reads differs: the batches of fork and of plain spawn,
    and no record at all."""
    reference = safe(tmp_path_factory, kind)
    assert plain_spawn(tmp_path_factory, kind)["batches"] == reference
    result, records = run(tmp_path, kind, platform)
    assert result.rc == 0 and result.batches == reference and pids(result) == 4, result
    assert records == [] and "autosafe_torch: summary" not in result.stderr, records


@pytest.mark.rule("DL220")
@pytest.mark.parametrize("persistent", [False, True])
def test_values_at_each_iterators_start_as_fork_has_them(tmp_path, tmp_path_factory,
                                                         persistent):
    """main() changes the config before every epoch: fork's workers see the value
    at their iterator's start (persistent ones: at their first start), and so do
    the shim's, as on macOS."""
    args = ("persistent",) if persistent else ()
    reference = safe(tmp_path_factory, "between_epochs", args)
    result, records = run(tmp_path, "between_epochs", "macos", args=args)
    assert result.rc == 0 and result.batches == reference, result
    assert [r["code"] for r in records] == ["DL220"]  # one record per loader


def test_a_healthy_fork_loader_is_not_looked_at(tmp_path):
    result, records = run(tmp_path, "module_dict", start_method="fork")
    assert result.rc == 0 and records == [], result


# -- what the workers' code reads, from the code ----------------------------------------

CONFIG = {"scale": 1.0}
UNREAD = 0
HELPED = [1]


def helper(x):
    return x * HELPED[0]


class Stats:
    mean = 0.0
    hidden = 1.0  # shadowed by the instance's own


class Plain:
    def __call__(self, x):
        return helper(x) + CONFIG["scale"]


class Spectra(Stats):
    label = "a"

    def __init__(self, items):
        self.items = items
        self.hidden = 2.0
        self.transform = Plain()

    def __getitem__(self, i):
        return self.transform(self.items[i] - type(self).mean + self.hidden) + self.scaled(i)

    def scaled(self, i):
        return i * Stats.mean

    def describe(self):  # no worker calls it
        return UNREAD

    def __len__(self):
        return len(self.items)


class Built(Spectra):
    def __init__(self, items):
        super().__init__(items)
        self.seen = UNREAD


def read_record(line):
    import json

    return json.loads(line)


def _labels(found):
    return sorted(r.label for r in found)


def _module_labels(found):
    return sorted(r.name for r in found if r.module == __name__)


def test_reads_are_found_through_methods_transforms_and_helpers():
    found = reads.reads_of([Spectra([1, 2, 3]), None, None])
    # Stats: the name the code reads it by (a class main() could rebind, compared by name)
    assert _module_labels(found) == ["CONFIG", "HELPED", "Stats", "Stats.mean", "helper"], found
    site = next(r.site for r in found if r.name == "Stats.mean")
    assert site.endswith("test_process_state.py:%d" % (Spectra.__getitem__.__code__
                                                         .co_firstlineno + 1)), site


def test_construction_is_read_only_where_the_workers_build():
    assert "UNREAD" not in _module_labels(reads.reads_of([Built([1])]))
    assert "UNREAD" in _module_labels(reads.reads_of([Built([1])], rebuilt=[Built]))


def test_what_goes_by_value_reads_nothing_from_the_module():
    """A lambda or a local function or class travels by value, with the globals
    it reads as the training process has them (cloudpickle): nothing to carry."""
    scale = 2.0

    class Local(Spectra):
        def __getitem__(self, i):
            return UNREAD * scale

    assert "UNREAD" not in _module_labels(reads.reads_of([Local([1]), lambda b: UNREAD]))


def test_a_library_function_the_program_put_in_place_is_read():
    import json

    assert ("json", "loads") not in {(r.module, r.name) for r in reads.reads_of([read_record])}
    saved = json.loads
    json.loads = helper
    try:
        found = reads.reads_of([read_record])
    finally:
        json.loads = saved
    assert ("json", "loads") in {(r.module, r.name) for r in found}, found


def test_the_cost_does_not_grow_with_the_dataset(monkeypatch):
    looked = []
    walk = reads._Walk.object

    def counting(self, obj):
        looked.append(1)
        return walk(self, obj)

    monkeypatch.setattr(reads._Walk, "object", counting)
    reads.reads_of([Spectra(list(range(10_000)))])
    small = len(looked)
    del looked[:]
    reads.reads_of([Spectra(list(range(1_000_000)))])
    assert len(looked) == small < 20  # the samples are data: never walked


BIG = None


def _sent_first():
    """What a worker of a new start of BIG's carry is sent for it."""
    return CARRY.start(None).sent()[0][0]


CARRY = process_state.Carry((reads.Read(__name__, "BIG", "here:1"),), 2)


def test_a_large_value_goes_once_through_shared_memory():
    """A large array as a tensor in shared memory, another large value as its
    pickle there (loaded only where a worker's own differs): one copy for every
    worker, made again only where the value changed since the last start."""
    global BIG
    BIG = np.random.default_rng(0).normal(size=(1024, 512)).astype(np.float32)
    first = _sent_first()
    assert _sent_first() is first and first.tensor.is_shared()
    again = pickle.loads(pickle.dumps(first))
    assert isinstance(again, np.ndarray) and np.array_equal(again, BIG)
    BIG[0, 0] += 1  # changed since: shared again
    assert _sent_first() is not first
    BIG = [("/data/img_%07d.JPEG" % i, i % 1000) for i in range(40_000)]
    lazy = pickle.loads(pickle.dumps(_sent_first()))
    assert isinstance(lazy, process_state._Lazy) and lazy.load() == BIG
    BIG = {"scale": 2.0}
    assert _sent_first() is BIG  # small: in the pickle, as it is


def test_a_new_interpreters_settings_are_the_tables_defaults():
    """A worker imports a setting's module to compare only where the training
    process's value is not a new interpreter's: each default is that value."""
    import subprocess

    code = ("import decimal, PIL.Image, PIL.ImageFile\n"
            "from autosafe_torch.remedies import process_state as p\n"
            "for s in p.SETTINGS:\n"
            "    if s.default is not p._UNKNOWN:\n"
            "        m = __import__(s.module, fromlist=['_'])\n"
            "        assert s.read(m) == s.default, s.label\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_settings_are_read_where_their_module_is_imported():
    carried = process_state.Carried([], None)
    labels = [e.label for e in carried.entries]
    assert "torch's default dtype" in labels and "the decimal context" in labels
    assert ("PIL.ImageFile.LOAD_TRUNCATED_IMAGES" in labels) == ("PIL.ImageFile" in sys.modules)
    saved = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        (entry,) = [e for e in process_state.Carried([], None).entries
                    if e.label == "torch's default dtype"]
    finally:
        torch.set_default_dtype(saved)
    assert entry.fingerprint == process_state.fingerprint(torch.float64)


@pytest.mark.parametrize("mode", ["warn", "strict"])
def test_warn_and_strict_modes_say_nothing_they_cannot_know(tmp_path, tmp_path_factory, mode):
    """Only a worker given the values can tell whether its own differ: with no
    fix made, nothing to say, and plain spawn's batches (no refusal either)."""
    log = tmp_path / "log.jsonl"
    result = run_scenario(tmp_path, "%s/module_dict.py" % FOLDER, activation="env",
                          start_method="spawn",
                          env={"AUTOSAFE_TORCH_MODE": mode, "AUTOSAFE_TORCH_LOG_FILE": str(log)})
    assert result.rc == 0 and result.batches == plain_spawn(tmp_path_factory,
                                                            "module_dict")["batches"], result
    assert json_log(log) == [], json_log(log)


UNORDERED = '''
import sys
import torch
from torch.utils.data import DataLoader, Dataset

CONFIG = {"scale": 1.0}

class Readings(Dataset):
    def __len__(self):
        return 16
    def __getitem__(self, i):
        return torch.tensor([i * CONFIG["scale"]])

if __name__ == "__main__":
    CONFIG["scale"] = float(sys.argv[1])
    loader = DataLoader(Readings(), batch_size=4, num_workers=2, in_order=False)
    print("VALUES", sorted(float(x) for batch in loader for x in batch.flatten()))
'''


@pytest.mark.rule("DL220")
def test_a_loader_not_watched_gets_its_record_once_its_workers_delivered(tmp_path):
    """``in_order=False``: torch's own iterator runs (the recovery does not watch
    it), the values are carried all the same, and the record waits for the
    workers' word."""
    if "in_order" not in __import__("inspect").signature(torch.utils.data.DataLoader).parameters:
        pytest.skip("needs torch >= 2.6 (DataLoader's in_order)")
    from support import run_script

    forked = run_script(tmp_path, UNORDERED, start_method="fork", args=("4",))
    log = tmp_path / "log.jsonl"
    shim = run_script(tmp_path, UNORDERED, activation="env", args=("4",),
                      env={"AUTOSAFE_TORCH_AS": "macos", "AUTOSAFE_TORCH_LOG_FILE": str(log)})
    values = re.compile(r"^VALUES .*$", re.M)
    assert shim.rc == 0 and values.search(shim.stdout).group(0) == \
        values.search(forked.stdout).group(0), shim
    (record,) = json_log(log)
    assert record["code"] == "DL220" and record["action"] == "fixed", record
