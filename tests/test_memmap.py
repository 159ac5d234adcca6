"""Memory maps travel to spawn/forkserver workers by reference (DL218 and
DL201, issue 27).

The scenario (tests/scenarios/memmap_dataset.py) holds numpy memmaps; each
worker says whether its array is a map of the file or a copy. Under spawn
(as on Linux, and as on macOS: no fork rung) and forkserver, the shim gives
the plain run's batches, records DL218 once, and the workers map the file
instead of receiving a copy. What cannot be mapped exactly (a mode='c' map
the parent changed, a strided view) is pickled as before. A file changed
while the workers start makes them fail loudly, never map other data.

An ``mmap.mmap`` does not pickle at all (tests/scenarios/mmap_dataset.py):
under spawn the shim maps it again in each real worker, with the batches
of forked workers (the known-safe run); a private map the parent wrote to
steps down to the fork rung; a rehearsed Mac (no /proc/self/maps, no fork
rung) refuses with the permanent fix rather than run on a shared map.
"""

import mmap
import os
import pickle
import re

import numpy as np
import pytest
from multiprocessing import context

from autosafe_torch.inspection import mappings
from autosafe_torch.remedies import memmaps, pickling
from support import json_log, result_once_per_run, run_scenario

PLATFORMS = {"spawn": {"AUTOSAFE_TORCH_AS": "macos"},
             "spawn-linux": {}, "forkserver": {"AUTOSAFE_TORCH_AS": "linux-py314"}}


def run(tmp_path, kind, method, shim, *more):
    log = tmp_path / ("log-%s-%s.jsonl" % (kind, shim))
    env = dict(PLATFORMS[method], AUTOSAFE_TORCH_LOG_FILE=str(log)) if shim else {}
    start = "spawn" if method.startswith("spawn") else method
    result = run_scenario(tmp_path, "memmap_dataset.py", args=(kind,) + more,
                          activation="env" if shim else None, start_method=start, env=env)
    records = json_log(log) if shim else []
    return result, records


def mapped(result, name="images"):
    """What each worker said of its array ``name``: a map of the file or not."""
    said = [line.split()[2] for line in result.stdout.splitlines()
            if line.startswith("WORKER %s " % name)]
    assert said, result
    return set(said)


@pytest.fixture(scope="module")
def plain_whole(tmp_path_factory):
    """The ``whole`` scenario under spawn without the shim: the known-safe batches
    (once in the whole test run)."""
    return result_once_per_run(tmp_path_factory, "memmap-plain-whole", lambda: run(
        tmp_path_factory.mktemp("plain"), "whole", "spawn", shim=False)[0])


@pytest.mark.parametrize("kind, method", [
    ("whole", "spawn-linux"), pytest.param("view", "spawn-linux", marks=pytest.mark.heavy),
    pytest.param("whole", "forkserver", marks=pytest.mark.heavy)])  # make heavy: CI
@pytest.mark.rule("DL218")
def test_memmap_is_mapped_in_each_worker_with_the_same_batches(tmp_path, kind, method,
                                                               plain_whole):
    plain = plain_whole if (kind, method) == ("whole", "spawn-linux") else \
        run(tmp_path, kind, method, shim=False)[0]
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


def test_on_macos_memmaps_are_pickled_as_there(tmp_path, plain_whole):
    """A Mac has no /proc/self/maps to find a map's file: the rehearsal shows
    what a Mac user gets, the memmaps pickled as before, nothing to record."""
    result, records = run(tmp_path, "whole", "spawn", shim=True)
    assert result.rc == 0 and result.batches == plain_whole.batches, result
    assert mapped(result) == {"mapped=False"}
    assert records == [] and "DL218" not in result.stderr, result


@pytest.mark.heavy  # make heavy (CI); test_what_a_worker_gets_is_what_pickling_gives: 'c'
def test_private_map_with_changes_is_pickled(tmp_path):
    """A mode='c' map holds the parent's changes, in no file: the workers get
    them, as pickling gives them; nothing to record."""
    plain, _ = run(tmp_path, "cow", "spawn-linux", shim=False)
    result, records = run(tmp_path, "cow", "spawn-linux", shim=True)
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
    plain, _ = run(tmp_path, "whole", "spawn-linux", False, "changed")
    result, records = run(tmp_path, "whole", "spawn-linux", True, "changed")
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
        sent = pickle.loads(pickling.WorkerPickler.dumps(obj))
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
        assert len(pickling.WorkerPickler.dumps(mm)) > mm.nbytes  # a queue, a copy: as ever
    finally:
        pickling.uninstall_reducers()


def test_moved_file_is_followed_deleted_file_is_pickled(path, starting, tmp_path):
    """The map names its file wherever it is now (/proc/self/maps): moved, it
    is mapped from there; deleted, it is pickled, as ever."""
    mm = np.memmap(path, np.float32, "r")
    moved = str(tmp_path / "moved")
    os.rename(path, moved)
    (np.zeros(30000, dtype=np.float32)).tofile(path)  # another file at the old path
    sent = pickle.loads(pickling.WorkerPickler.dumps(mm))
    assert isinstance(sent.base, mmap.mmap) and np.array_equal(sent, mm)
    assert mappings.reference(mm)[0].path == moved
    os.unlink(moved)
    sent = pickle.loads(pickling.WorkerPickler.dumps(mm))
    assert not isinstance(sent.base, mmap.mmap) and np.array_equal(sent, mm)
    assert mappings.reference(mm)[0] is None


def test_worker_refuses_a_changed_file(path):
    mm = np.memmap(path, np.float32, "r")
    ref, why = mappings.reference(mm)
    assert why is None
    np.zeros(30000, dtype=np.float32).tofile(path)  # rewritten in place
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    with pytest.raises(memmaps.MappedFileChanged):
        memmaps.mapped_again(*ref.args())
    os.unlink(path)
    with pytest.raises(memmaps.MappedFileChanged):
        memmaps.mapped_again(*ref.args())


# -- mmap.mmap: a map of a named file, mapped again in each worker (DL201) ------------

def run_maps(tmp_path, kind, method, shim):
    log = tmp_path / ("maps-%s-%s-%s.jsonl" % (kind, method, shim))
    env = dict(PLATFORMS.get(method, {}), AUTOSAFE_TORCH_LOG_FILE=str(log)) if shim else {}
    start = "spawn" if method.startswith("spawn") else method
    result = run_scenario(tmp_path, "mmap_dataset.py", args=(kind,), start_method=start,
                          activation="env" if shim else None, env=env)
    records = json_log(log) if shim else []
    return result, records


def real_workers(result):
    # Two workers print at once: their lines may run together ("WORKER real=TrueWORKER ...").
    said = set(re.findall(r"WORKER (real=(?:True|False))", result.stdout))
    assert said, result
    return said == {"real=True"}


@pytest.mark.rule("DL201")
def test_mmap_of_a_named_file_is_mapped_again_in_each_worker(tmp_path):
    """Without the shim spawn cannot start the workers; with it each real worker
    maps the three maps again (read-only at an offset and a position, shared
    writable, copy-on-write) and gives the forked workers' batches."""
    safe, _ = run_maps(tmp_path, "maps", "fork", shim=False)
    assert safe.rc == 0 and safe.batches and real_workers(safe), safe
    plain, _ = run_maps(tmp_path, "maps", "spawn-linux", shim=False)
    assert plain.rc != 0 and "cannot pickle 'mmap.mmap' object" in plain.stderr, plain
    result, records = run_maps(tmp_path, "maps", "spawn-linux", shim=True)
    assert result.rc == 0 and result.batches == safe.batches, result
    assert real_workers(result), result
    (record,) = [r for r in records if r["code"] == "DL201"]
    assert record["action"] == "fixed", record
    assert record["strategy"] == "repair: map memory maps again by path in each worker"
    assert record["before"]["maps"] == ["dataset.frames", "dataset.lookup", "dataset.scales"]
    assert "mapped again from their files in each of 2 workers" in record["done"], record


def test_mmap_that_cannot_be_mapped_again_steps_down(tmp_path):
    """A private map the parent wrote to (its change is in no file) is not
    mapped again: on Linux the fork rung gives the forked workers' batches;
    on a rehearsed Mac (no fork rung, no /proc/self/maps) the loader refuses,
    naming the map and the permanent fix, rather than share one map."""
    safe, _ = run_maps(tmp_path, "written", "fork", shim=False)
    result, records = run_maps(tmp_path, "written", "spawn-linux", shim=True)
    assert result.rc == 0 and result.batches == safe.batches and real_workers(result), result
    (record,) = [r for r in records if r["code"] == "DL201"]
    assert record["strategy"] == "start method: fork", record
    mac, records = run_maps(tmp_path, "maps", "spawn", shim=True)
    assert mac.rc != 0 and "BATCHES" not in mac.stdout, mac
    assert "dataset.frames (an mmap) cannot be mapped again for each emulated worker" \
        in mac.stderr, mac
    assert "fix: open files" in mac.stderr, mac
    assert [r["action"] for r in records if r["code"] == "DL201"] == ["failed"], records


def test_mmap_under_fork_is_left_alone(tmp_path):
    """Healthy control: forked workers hold the maps; no record, the same batches."""
    plain, _ = run_maps(tmp_path, "maps", "fork", shim=False)
    result, records = run_maps(tmp_path, "maps", "fork", shim=True)
    assert result.rc == 0 and result.batches == plain.batches, result
    assert records == [] and "autosafe_torch: summary" not in result.stderr, result


@pytest.fixture
def maps_starting():
    pickling.install(memmaps.map_reducers())
    context.set_spawning_popen(object())
    yield
    context.set_spawning_popen(None)
    pickling.uninstall_reducers()


@pytest.mark.parametrize("access", ["read", "write", "copy", "default"])
def test_what_a_worker_maps_is_what_a_forked_one_holds(path, maps_starting, access):
    """Same bytes, length, position and access; a shared map's writes reach
    the parent's map (as a forked worker's do), a copy's stay its own."""
    mode = "r+b" if access in ("write", "default") else "rb"
    with open(path, mode) as f:
        kw = {} if access == "default" else {"access": memmaps.ACCESS[access]}
        m = mmap.mmap(f.fileno(), 3 * mmap.ALLOCATIONGRANULARITY,
                      offset=mmap.ALLOCATIONGRANULARITY, **kw)
    m.seek(77)
    sent = pickle.loads(pickling.WorkerPickler.dumps(m))
    assert type(sent) is mmap.mmap and sent[:] == m[:] and sent.tell() == 77
    assert len(sent) == len(m) and sent.size() == m.size()
    if access == "read":
        with pytest.raises(TypeError):
            sent.write(b"x")
        return
    sent[0] = (m[0] + 1) % 256
    assert (m[0] == sent[0]) == (access != "copy")


def test_maps_that_cannot_be_mapped_again(path, maps_starting, tmp_path):
    """Refused with why: a private map this process wrote to, a deleted file,
    a closed map; never outside a process start. An anonymous map has no file
    to map again (said so, also where there is no /proc): it goes through
    shared memory instead (tests/test_holders.py)."""
    with open(path, "rb") as f:
        written = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        written[3] = 1
        gone = tmp_path / "gone.bin"
        gone.write_bytes(b"x" * 8192)
        with open(gone, "rb") as g:
            deleted = mmap.mmap(g.fileno(), 0, access=mmap.ACCESS_READ)
        os.unlink(gone)
        closed = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        closed.close()
    cases = {written: "wrote to", deleted: "deleted", closed: "closed"}
    for m, why in cases.items():
        assert why in mappings.map_reference(m)[1]
        with pytest.raises(TypeError, match="cannot pickle 'mmap.mmap' object"):
            pickling.WorkerPickler.dumps(m)
    anonymous = mmap.mmap(-1, 4096)
    assert "an anonymous map" in mappings.map_reference(anonymous)[1]
    assert "an anonymous map" in mappings.map_reference(anonymous, None)[1]  # no /proc
    assert mappings.travels(anonymous) and not mappings.travels(written)
    context.set_spawning_popen(None)
    with open(path, "rb") as f:
        fine = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    assert mappings.map_reference(fine)[1] is None
    with pytest.raises(TypeError, match="^cannot pickle 'mmap.mmap' object$"):
        pickling.WorkerPickler.dumps(fine)  # a queue: as ever


def test_emulated_copies_map_again_or_refuse(path):
    """An emulated worker's copy holds its own map at the parent's position;
    an anonymous map cannot be copied exactly: refused, named."""
    from autosafe_torch.errors import NoExactRung
    from autosafe_torch.remedies.copies import CopyPlan

    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    m.seek(9)
    (copied,) = CopyPlan((m,)).copy()
    assert copied is not m and copied[:] == m[:] and copied.tell() == 9
    copied.read(5)
    assert m.tell() == 9
    with pytest.raises(NoExactRung, match="an anonymous map"):
        CopyPlan((mmap.mmap(-1, 4096),)).copy()
