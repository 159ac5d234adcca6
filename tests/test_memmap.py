"""Memory maps travel to spawn/forkserver workers by reference (DL218, issue 27).

The scenario (tests/scenarios/memmap_dataset.py) holds numpy memmaps; each
worker says whether its array is a map of the file or a copy. Under spawn
(as on Linux, and as on macOS: no fork rung) and forkserver, the shim gives
the plain run's batches, records DL218 once, and the workers map the file
instead of receiving a copy. What cannot be mapped exactly (a mode='c' map
the parent changed, a strided view) is pickled as before. A file changed
while the workers start makes them fail loudly, never map other data.
"""

import json
import mmap
import os
import pickle

import numpy as np
import pytest
from multiprocessing import context
from multiprocessing.reduction import ForkingPickler

from autosafe_torch.remedies import memmaps, pickling
from support import run_scenario

PLATFORMS = {"spawn": {"AUTOSAFE_TORCH_AS": "macos"},
             "spawn-linux": {}, "forkserver": {"AUTOSAFE_TORCH_AS": "linux-py314"}}


def run(tmp_path, kind, method, shim, *more):
    log = tmp_path / ("log-%s-%s.jsonl" % (kind, shim))
    env = dict(PLATFORMS[method], AUTOSAFE_TORCH_LOG_FILE=str(log)) if shim else {}
    start = "spawn" if method.startswith("spawn") else method
    result = run_scenario(tmp_path, "memmap_dataset.py", args=(kind,) + more,
                          activation="env" if shim else None, start_method=start, env=env)
    records = [json.loads(line) for line in log.read_text().splitlines()] \
        if shim and log.exists() else []
    return result, records


def mapped(result, name="images"):
    """What each worker said of its array ``name``: a map of the file or not."""
    said = [line.split()[2] for line in result.stdout.splitlines()
            if line.startswith("WORKER %s " % name)]
    assert said, result
    return set(said)


@pytest.mark.parametrize("kind, method", [
    ("whole", "spawn"), ("view", "spawn-linux"),
    pytest.param("whole", "forkserver", marks=pytest.mark.heavy)])  # make heavy: CI
@pytest.mark.rule("DL218")
def test_memmap_is_mapped_in_each_worker_with_the_same_batches(tmp_path, kind, method):
    plain, _ = run(tmp_path, kind, method, shim=False)
    assert plain.rc == 0 and plain.batches, plain
    assert mapped(plain) == {"mapped=False"}  # pickled: a copy in every worker
    result, records = run(tmp_path, kind, method, shim=True)
    assert result.rc == 0 and result.batches == plain.batches, result
    assert mapped(result) == {"mapped=True"}
    assert [(r["code"], r["action"]) for r in records] == [("DL218", "fixed")], records
    assert "dataset.images (a numpy memmap of rows.bin," in records[0]["done"]
    assert result.stderr.count("DL218 memmap-by-reference") == 1, result
    if kind == "view":  # a strided view: pickled, in the layout pickling gives
        assert mapped(result, "strided") == {"mapped=False"}
        assert "dataset.strided" not in records[0]["done"]
        assert "dataset.strided (a strided or unaligned view" in records[0]["why"]


def test_private_map_with_changes_is_pickled(tmp_path):
    """A mode='c' map holds the parent's changes, in no file: the workers get
    them, as pickling gives them; nothing to record."""
    plain, _ = run(tmp_path, "cow", "spawn", shim=False)
    result, records = run(tmp_path, "cow", "spawn", shim=True)
    assert plain.rc == 0 and result.rc == 0 and result.batches == plain.batches, result
    assert mapped(result) == {"mapped=False"}
    assert records == [] and "DL218" not in result.stderr, result


def test_fork_control_unchanged(tmp_path):
    """Forked workers inherit the map: no record, the same batches."""
    plain = run_scenario(tmp_path, "memmap_dataset.py", args=("whole",), start_method="fork")
    result = run_scenario(tmp_path, "memmap_dataset.py", args=("whole",), start_method="fork",
                          activation="env")
    assert plain.rc == 0 and result.rc == 0 and result.batches == plain.batches, result
    assert "DL218" not in result.stderr and "autosafe_torch: summary" not in result.stderr


def test_changed_file_fails_loudly_never_other_data(tmp_path):
    """The file's modification time changes right after the workers were
    asked for: they refuse to map it, the record says DL218 did not hold,
    and the recovery gives the plain run's batches."""
    plain, _ = run(tmp_path, "whole", "spawn", False, "changed")
    result, records = run(tmp_path, "whole", "spawn", True, "changed")
    assert plain.rc == 0 and result.rc == 0 and result.batches == plain.batches, result
    assert "MappedFileChanged" in result.stderr, result
    actions = {r["code"]: r["action"] for r in records}
    assert actions.get("DL218") == "failed", records
    assert "DL210" in actions, records


# -- the reducer alone ----------------------------------------------------------------

@pytest.fixture
def starting():
    """As while a process is being started (what spawn's Popen sets)."""
    memmaps.install_reducers()
    context.set_spawning_popen(object())
    yield
    context.set_spawning_popen(None)
    pickling.uninstall_reducers()


@pytest.fixture
def path(tmp_path):
    p = tmp_path / "data.bin"
    (np.arange(30000, dtype=np.float32) / 7).tofile(p)
    return str(p)


def views(mm):
    return {"whole": mm, "rows": mm[7:50], "row": mm[3], "T": mm.T,
            "strided": mm[:, ::2], "fortran": np.asfortranarray(mm).view(np.memmap)}


@pytest.mark.parametrize("mode", ["r", "r+", "c"])
def test_what_a_worker_gets_is_what_pickling_gives(path, starting, mode):
    mm = np.memmap(path, np.float32, mode, offset=12, shape=(100, 200))
    for name, obj in views(mm).items():
        sent = pickle.loads(ForkingPickler.dumps(obj))
        plain = pickle.loads(pickle.dumps(obj))
        assert type(sent) is type(plain) is np.memmap, name
        assert (sent.shape, sent.strides, sent.dtype) == (plain.shape, plain.strides, plain.dtype)
        assert np.array_equal(sent, plain), name
        assert (sent._mmap, sent.filename, sent.offset, sent.mode) == (None,) * 4
        assert sent.flags.writeable and type(sent[1:]) is type(plain[1:]), name
        by_reference = isinstance(sent.base, mmap.mmap)
        assert by_reference == (mode != "c" and name in ("whole", "rows", "row", "T")), name
        if by_reference:  # copy-on-write: the worker's writes stay its own
            sent.flat[0] = -5
            assert obj.flat[0] != -5 and np.memmap(path, np.float32, "r")[3] != -5


def test_only_while_a_process_starts(path):
    memmaps.install_reducers()
    try:
        mm = np.memmap(path, np.float32, "r")
        assert len(ForkingPickler.dumps(mm)) > mm.nbytes  # a queue, a copy: as ever
    finally:
        pickling.uninstall_reducers()


def test_moved_file_is_followed_deleted_file_is_pickled(path, starting, tmp_path):
    """The map names its file wherever it is now (/proc/self/maps): moved, it
    is mapped from there; deleted, it is pickled, as ever."""
    mm = np.memmap(path, np.float32, "r")
    moved = str(tmp_path / "moved")
    os.rename(path, moved)
    (np.zeros(30000, dtype=np.float32)).tofile(path)  # another file at the old path
    sent = pickle.loads(ForkingPickler.dumps(mm))
    assert isinstance(sent.base, mmap.mmap) and np.array_equal(sent, mm)
    assert memmaps.reference(mm)[0].path == moved
    os.unlink(moved)
    sent = pickle.loads(ForkingPickler.dumps(mm))
    assert not isinstance(sent.base, mmap.mmap) and np.array_equal(sent, mm)
    assert memmaps.reference(mm)[0] is None


def test_worker_refuses_a_changed_file(path):
    mm = np.memmap(path, np.float32, "r")
    ref, why = memmaps.reference(mm)
    assert why is None
    np.zeros(30000, dtype=np.float32).tofile(path)  # rewritten in place
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    with pytest.raises(memmaps.MappedFileChanged):
        memmaps.mapped_again(*ref.args())
    os.unlink(path)
    with pytest.raises(memmaps.MappedFileChanged):
        memmaps.mapped_again(*ref.args())
