"""Tensors mapped from a file travel to spawn/forkserver workers by reference
(DL218, issue 34 item 2).

The scenario (tests/scenarios/mapped_tensor.py) holds ``torch.load(path,
mmap=True)`` tensors; each worker says whether its tensor's storage lies in
a map of the file, and the training process whether its tensor was moved
into shared memory and how much ``/dev/shm`` grew. Under spawn (as on Linux)
and forkserver, the shim gives the plain run's batches, records DL218 once,
the workers (real processes) map the file, and ``/dev/shm`` does not grow by
the tensor. A rehearsed Mac has no /proc/self/maps: torch's way, as there. A
private map the parent wrote to goes torch's way; a file changed while the
workers start makes them fail loudly, never map other data. A
``UntypedStorage.from_file`` tensor, which torch cannot send at all, goes.
"""

import inspect
import os
import pickle
import re

import pytest
import torch
from multiprocessing import context
from multiprocessing.reduction import ForkingPickler

from autosafe_torch import torch_private as tp
from autosafe_torch.inspection import mappings, tensors
from autosafe_torch.remedies import mapped_tensors, memmaps, pickling
from support import json_log, one_of, result_once_per_run, run_scenario

PLATFORMS = {"spawn": {"AUTOSAFE_TORCH_AS": "macos"},
             "spawn-linux": {}, "forkserver": {"AUTOSAFE_TORCH_AS": "linux-py314"}}
TOKENS = 96 * (1 << 14) * 4  # the scenario's tokens, in bytes
# torch.load(mmap=True), what the scenario and most tests here map a file by, is
# torch 2.1's; torch 2.0 maps by UntypedStorage.from_file (and np.memmap) only.
LOAD_MMAP = "mmap" in inspect.signature(torch.load).parameters
WHY_NO_LOAD_MMAP = "needs torch >= 2.1: torch.load(mmap=True) makes this test's mapped tensors"
needs_load_mmap = pytest.mark.skipif(not LOAD_MMAP, reason=WHY_NO_LOAD_MMAP)


def run(tmp_path, kind, method, shim, *more):
    log = tmp_path / ("log-%s-%s-%s.jsonl" % (kind, method, shim))
    env = dict(PLATFORMS[method], AUTOSAFE_TORCH_LOG_FILE=str(log)) if shim else {}
    start = "spawn" if method.startswith("spawn") else method
    result = run_scenario(tmp_path, "mapped_tensor.py", args=(kind,) + more,
                          activation="env" if shim else None, start_method=start, env=env)
    return result, json_log(log) if shim else []


# Two workers' lines may interleave (each print is two writes, unbuffered).
SAID = re.compile(r"WORKER ([a-z]+) mapped=(True|False) shared=(True|False) real=(True|False)")


def workers(result):
    """What the workers said of their tensors: ``{(name, what): {value}}``."""
    said = {}
    for name, *values in SAID.findall(result.stdout):
        for what, value in zip(("mapped", "shared", "real"), values):
            said.setdefault((name, what), set()).add(value == "True")
    assert said, result
    return said


def parent(result):
    """``(tokens moved into shared memory, /dev/shm growth in bytes)``."""
    (line,) = [ln for ln in result.stdout.splitlines() if ln.startswith("PARENT ")]
    shared, rise = (pair.split("=")[1] for pair in line.split()[1:])
    return shared == "True", int(rise)


def by_reference(result):
    """Each real worker mapped the file; the parent's tensor stayed the map."""
    said = workers(result)
    shared, rise = parent(result)
    return (said[("tokens", "mapped")] == said[("weight", "mapped")] == {True}
            and said[("tokens", "shared")] == {False} and said[("tokens", "real")] == {True}
            and not shared and rise < TOKENS // 2)


def torch_way(result):
    """torch's reducer: the parent's tensor moved into /dev/shm, the workers' too."""
    said = workers(result)
    shared, rise = parent(result)
    return (said[("tokens", "mapped")] == {False} and said[("tokens", "shared")] == {True}
            and shared and rise >= TOKENS)


@pytest.fixture(scope="module")
def plain_load(tmp_path_factory):
    """The ``load`` scenario under spawn without the shim: the known-safe batches
    (once in the whole test run)."""
    if not LOAD_MMAP:
        pytest.skip(WHY_NO_LOAD_MMAP)
    plain = result_once_per_run(tmp_path_factory, "mapped-tensors-plain-load", lambda: run(
        tmp_path_factory.mktemp("plain"), "load", "spawn-linux", shim=False)[0])
    assert plain.rc == 0 and plain.batches and torch_way(plain), plain
    return plain


@pytest.mark.parametrize("method", one_of(("spawn-linux", "forkserver"), "spawn-linux"))
@pytest.mark.rule("DL218")
def test_mapped_tensor_is_mapped_in_each_worker_with_the_same_batches(tmp_path, method,
                                                                      plain_load):
    result, records = run(tmp_path, "load", method, shim=True)
    assert result.rc == 0 and result.batches == plain_load.batches, result
    assert by_reference(result), result
    assert [(r["code"], r["action"]) for r in records] == [("DL218", "fixed")], records
    assert records[0]["before"] == {"tensors": ["dataset.tokens", "dataset.weight",
                                                "dataset.cols"]}, records
    assert records[0]["done"].startswith(
        "dataset.tokens (a tensor mapped from tokens.pt, 6.0 MiB), dataset.weight (a tensor "
        "mapped from tokens.pt, 3.8 KiB)"), records
    assert "instead of copied into shared memory" in records[0]["done"], records
    assert result.stderr.count("DL218 memmap-by-reference") == 1, result


@pytest.mark.heavy  # what a Mac gets is torch's own way: make heavy (CI)
@pytest.mark.rule("DL218")
def test_on_macos_tensors_go_through_shared_memory_as_there(tmp_path, plain_load):
    """A Mac has no /proc/self/maps to find a map's file: the rehearsal shows
    what a Mac user gets, torch's shared memory, nothing to record."""
    result, records = run(tmp_path, "load", "spawn", shim=True)
    assert result.rc == 0 and result.batches == plain_load.batches, result
    assert torch_way(result), result
    assert records == [] and "DL218" not in result.stderr, result


@pytest.mark.rule("DL218")
def test_tensor_not_from_a_file_records_nothing(tmp_path, plain_load):
    """Healthy control: the same tensors made in memory go torch's way."""
    result, records = run(tmp_path, "memory", "spawn-linux", shim=True)
    assert result.rc == 0 and result.batches == plain_load.batches, result
    assert torch_way(result), result
    assert records == [] and "autosafe_torch: summary" not in result.stderr, result


@pytest.mark.rule("DL218")
def test_fork_control_unchanged(tmp_path, plain_load):
    """Forked workers inherit the map: no record, the same batches (the
    sampler's order is drawn in the training process under every start method)."""
    result = run_scenario(tmp_path, "mapped_tensor.py", args=("load",), start_method="fork",
                          activation="env")
    assert result.rc == 0 and result.batches == plain_load.batches, result
    assert workers(result)[("tokens", "mapped")] == {True}, result
    assert "DL218" not in result.stderr and "autosafe_torch: summary" not in result.stderr


@pytest.mark.rule("DL218")
def test_changed_file_fails_loudly_never_other_data(tmp_path, plain_load):
    """The file's modification time changes right after the first epoch's
    workers were asked for: they refuse to map it, the record says DL218 did
    not hold, and the recovery gives the plain run's batches."""
    result, records = run(tmp_path, "load", "spawn-linux", True, "changed")
    assert result.rc == 0 and result.batches == plain_load.batches, result
    assert "MappedFileChanged" in result.stderr, result
    actions = {r["code"]: r["action"] for r in records}
    assert actions.get("DL218") == "failed", records
    assert "DL210" in actions, records


@pytest.mark.rule("DL218")
def test_from_file_tensor_goes_where_torch_cannot(tmp_path, plain_load):
    """torch cannot send a storage of ``UntypedStorage.from_file`` to a spawn
    worker (EBADF); by reference each worker maps the file, with the batches
    of the same data loaded (the known-safe run)."""
    plain, _ = run(tmp_path, "from_file", "spawn-linux", shim=False)
    assert plain.rc != 0 and "Bad file descriptor" in plain.stderr, plain
    result, records = run(tmp_path, "from_file", "spawn-linux", shim=True)
    assert result.rc == 0 and result.batches == plain_load.batches, result
    said = workers(result)
    assert said[("tokens", "mapped")] == {True} and said[("tokens", "real")] == {True}, result
    assert [(r["code"], r["action"]) for r in records] == [("DL218", "fixed")], records
    assert records[0]["before"] == {"tensors": ["dataset.tokens"]}, records


@pytest.mark.heavy  # make heavy (CI); test_written_private_map_goes_torch_s_way: in process
@pytest.mark.rule("DL218")
def test_private_map_the_parent_wrote_to_is_pickled_as_before(tmp_path):
    """Its change is in no file: the workers get it through torch's shared
    memory, as without the shim; nothing to record."""
    plain, _ = run(tmp_path, "written", "spawn-linux", shim=False)
    result, records = run(tmp_path, "written", "spawn-linux", shim=True)
    assert plain.rc == 0 and result.rc == 0 and result.batches == plain.batches, result
    assert torch_way(result), result
    assert records == [] and "DL218" not in result.stderr, result


# -- the reducer alone ----------------------------------------------------------------

class Detached:
    """What a spawn Popen's DupFd gives torch's reducer: the descriptor, later."""

    def __init__(self, fd):
        self.fd = fd

    def detach(self):
        return self.fd


class Starting:
    """Stands in for the Popen of a child being started (spawn's passes
    descriptors through DupFd)."""

    @staticmethod
    def duplicate_for_child(fd):
        return os.dup(fd)

    DupFd = Detached


def file_of(path):
    st = os.stat(path)
    return st.st_dev, st.st_ino


@pytest.fixture
def saved(tmp_path):
    path = str(tmp_path / "weights.pt")
    torch.save({"tokens": torch.arange(50_000, dtype=torch.float32) / 7,
                "table": torch.arange(600, dtype=torch.int64).reshape(30, 20),
                "half": torch.linspace(-1, 1, 64, dtype=torch.float16)}, path)
    return path


@pytest.fixture
def starting(saved):
    """As while a process is being started, the reducer installed for ``saved``."""
    mapped_tensors.install_reducers([file_of(saved)])
    context.set_spawning_popen(Starting())
    yield
    context.set_spawning_popen(None)
    pickling.uninstall_reducers()
    mapped_tensors._files.clear()


def sent(obj):
    """``obj`` as a child started now gets it (each start has a Popen of its own)."""
    if context.get_spawning_popen() is not None:
        context.set_spawning_popen(Starting())
    return pickle.loads(pickling.WorkerPickler.dumps(obj))  # as our workers' start pickles


def maps_of(path):
    with open("/proc/self/maps") as f:
        return [line for line in f if line.rstrip().endswith(os.path.realpath(path))]


def in_map_of(tensor, path):
    address = tensor.untyped_storage().data_ptr()
    for line in maps_of(path):
        start, end = (int(x, 16) for x in line.split()[0].split("-"))
        if start <= address < end:
            return True
    return False


@needs_load_mmap
@pytest.mark.rule("DL218")
def test_what_a_worker_gets_is_what_torch_gives(saved, starting):
    loaded = torch.load(saved, mmap=True)
    tokens, table = loaded["tokens"], loaded["table"]
    views = {"tokens": tokens, "slice": tokens[7:900], "strided": tokens[3::5],
             "2d": tokens[:40_000].view(200, 200)[10:, ::3], "table.T": table.t(),
             "int param": torch.nn.Parameter(table, requires_grad=False),
             "param": torch.nn.Parameter(tokens), "half": loaded["half"]}
    got = {name: sent(obj) for name, obj in views.items()}
    for name, obj in views.items():
        new = got[name]
        assert type(new) is type(obj), name
        assert (new.dtype, new.shape, new.stride(), new.storage_offset(), new.requires_grad) \
            == (obj.dtype, obj.shape, obj.stride(), obj.storage_offset(), obj.requires_grad)
        assert torch.equal(new, obj), name
        assert in_map_of(new, saved) and not new.is_shared(), name
        assert new.untyped_storage().nbytes() == obj.untyped_storage().nbytes(), name
        assert not obj.is_shared(), name  # the parent's tensor is still the map
    # torch gives the same, through shared memory (moving the parent's storage there)
    for name, obj in views.items():
        plain = pickle.loads(ForkingPickler.dumps(obj.detach().clone()))
        assert torch.equal(plain, got[name]) and plain.is_shared(), name


@needs_load_mmap
@pytest.mark.rule("DL218")
def test_one_map_per_file_one_storage_per_storage(saved, starting):
    loaded = torch.load(saved, mmap=True)
    before = len(maps_of(saved))
    tokens, part, table = sent((loaded["tokens"], loaded["tokens"][5:], loaded["table"]))
    assert tokens.untyped_storage() is part.untyped_storage()
    assert table.untyped_storage() is not tokens.untyped_storage()
    assert len(maps_of(saved)) == before + 1
    tokens[0] = 123.0  # copy-on-write: the worker's writes stay its own
    assert part[-1] == tokens[-1] and loaded["tokens"][0] == 0
    assert torch.load(saved, mmap=True)["tokens"][0] == 0


@needs_load_mmap
@pytest.mark.rule("DL218")
def test_only_while_a_process_starts_and_only_the_loader_s_files(saved, starting, tmp_path):
    loaded = torch.load(saved, mmap=True)
    other = str(tmp_path / "other.pt")
    torch.save({"w": torch.ones(1000)}, other)
    stranger = torch.load(other, mmap=True)["w"]  # a file no loader's tensor lies in
    assert sent(stranger).is_shared() and stranger.is_shared()
    context.set_spawning_popen(None)
    tokens = loaded["tokens"]
    data = ForkingPickler.dumps(tokens)  # a queue: torch's shared memory, as ever
    assert tokens.is_shared() and pickle.loads(data).is_shared()


@needs_load_mmap
@pytest.mark.rule("DL218")
def test_written_private_map_goes_torch_s_way(saved, starting):
    loaded = torch.load(saved, mmap=True)
    tokens, table = loaded["tokens"], loaded["table"]
    assert tensors.reference(table)[1] is None
    tokens[3] = -1.0  # a page of the map is this process's now: in no file
    ref, why = tensors.reference(table)  # the whole map counts
    assert ref is None and "wrote to" in why
    new = sent(tokens)
    assert new[3] == -1.0 and new.is_shared() and tokens.is_shared()


@needs_load_mmap
@pytest.mark.rule("DL218")
def test_moved_file_is_followed_deleted_file_goes_torch_s_way(saved, starting, tmp_path):
    tokens = torch.load(saved, mmap=True)["tokens"]
    moved = str(tmp_path / "moved.pt")
    os.rename(saved, moved)
    torch.save({"x": torch.zeros(3)}, saved)  # another file at the old path
    assert tensors.reference(tokens)[0].path == moved
    assert in_map_of(sent(tokens), moved)
    os.unlink(moved)
    ref, why = tensors.reference(tokens)
    assert ref is None and "deleted" in why
    assert sent(tokens).is_shared()
    assert torch.equal(tokens, torch.arange(50_000, dtype=torch.float32) / 7)


@needs_load_mmap
@pytest.mark.rule("DL218")
def test_worker_refuses_a_changed_file(saved):
    loaded = torch.load(saved, mmap=True)
    ref, why = tensors.reference(loaded["tokens"])
    assert why is None
    args = ref.args(torch.Tensor)
    st = os.stat(saved)
    os.utime(saved, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # rewritten, same bytes
    with pytest.raises(memmaps.MappedFileChanged, match="weights.pt changed"):
        mapped_tensors.mapped_tensor_again(*args)
    os.unlink(saved)
    with pytest.raises(memmaps.MappedFileChanged, match="cannot be mapped again"):
        mapped_tensors.mapped_tensor_again(*args)


@pytest.mark.rule("DL218")
def test_from_file_storages_and_no_maps_to_read(tmp_path, starting):
    path = str(tmp_path / "raw.bin")
    (torch.arange(4096, dtype=torch.int32)).numpy().tofile(path)
    mapped_tensors.install_reducers([file_of(path)])
    for shared in (False, True):
        t = torch.empty(0, dtype=torch.int32).set_(
            torch.UntypedStorage.from_file(path, shared=shared, nbytes=4 * 4096))
        new = sent(t[10:])
        assert torch.equal(new, t[10:]) and in_map_of(new, path), shared
        new[0] = -3  # private: the file keeps its bytes, the parent's map too
        assert t[10] == 10
        del new  # the next is another worker's: its own map
    # where there is no /proc/self/maps (macOS), nothing can be said of any tensor
    assert tensors.reference(t, mappings.Maps(None)) == (None, None)
    # memory of no file, and torch's shared memory (which stays shared): nothing to say
    for other in (torch.ones(4096), torch.ones(4096).share_memory_()):
        assert tensors.reference(other) == (None, None)


@pytest.mark.rule("DL218")
def test_a_storage_is_sent_again_after_the_last_one_was_freed(tmp_path, starting):
    """Each worker of each epoch rebuilds the tensor (here: one process, its
    earlier copies freed or kept): never a dangling cache of storages (torch 2.0
    frees a storage's Python object without clearing its weak references, and
    replacing a cached one segfaulted)."""
    path = str(tmp_path / "raw.bin")
    (torch.arange(4096, dtype=torch.int32)).numpy().tofile(path)
    mapped_tensors.install_reducers([file_of(path)])
    t = torch.empty(0, dtype=torch.int32).set_(
        torch.UntypedStorage.from_file(path, shared=False, nbytes=4 * 4096))
    kept = []
    for i in range(6):
        new, part = sent((t[10:], t[20:]))
        assert torch.equal(new, t[10:]) and in_map_of(new, path), i
        # one storage for the views of one storage: the same bytes, and on a torch
        # whose storages keep their Python object, the same storage
        assert new.untyped_storage().data_ptr() == part.untyped_storage().data_ptr()
        assert (new.untyped_storage() is part.untyped_storage()) \
            == tp.storages_keep_their_python_object()
        if i % 2:
            kept.append(new)
        del new, part


@needs_load_mmap
@pytest.mark.rule("DL218")
def test_a_loaded_map_is_found(tmp_path):
    saved = str(tmp_path / "saved.pt")
    torch.save({"t": torch.ones(9)}, saved)
    tokens = torch.load(saved, mmap=True)["t"]
    assert tensors.reference(tokens)[0] is not None
    assert tensors.reference(tokens, mappings.Maps(None)) == (None, None)


@needs_load_mmap
@pytest.mark.rule("DL218")
def test_an_error_of_ours_sends_it_torch_s_way(saved, starting, monkeypatch):
    tokens = torch.load(saved, mmap=True)["tokens"]

    def broken(*args):
        raise ValueError("ours")

    monkeypatch.setattr(mapped_tensors, "reference", broken)
    new = sent(tokens)
    assert torch.equal(new, tokens) and new.is_shared() and tokens.is_shared()
