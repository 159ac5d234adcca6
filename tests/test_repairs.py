import concurrent.futures
import io
import os
import pickle
import re
import subprocess
import sys
import textwrap
import threading

import pytest
from multiprocessing.reduction import ForkingPickler

from autosafe_torch.inspection import holdings
from autosafe_torch.remedies import byvalue, pickling, reopen
from autosafe_torch.inspection.probe import probe
from support import CHILD_MAIN, cannot_pickle, json_log, result_once_per_run, run_script

# The building blocks alone: without the shim's own DataLoader patches.
OFF = {"AUTOSAFE_TORCH": "0"}


class Holder:
    def __init__(self, **attrs):
        self.__dict__.update(attrs)


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "data.bin"
    path.write_bytes(bytes(range(256)) * 4)
    text = tmp_path / "data.txt"
    text.write_text("héllo\nwörld\n" * 3, encoding="latin-1")
    return path, text


@pytest.fixture
def reducers():
    reopen.install_reducers()
    yield
    pickling.uninstall_reducers()


def roundtrip(obj):
    return pickle.loads(pickling.WorkerPickler.dumps(obj))  # as our workers' start pickles


def test_file_kind(data, tmp_path):
    path, text = data
    with open(path, "rb") as a, open(path, "rb", buffering=0) as b, open(text) as c:
        assert {holdings.file_kind(f) for f in (a, b, c)} == {"readonly-file"}
    for mode in ("wb", "ab", "r+b", "w", "a+"):
        with open(tmp_path / "out", mode) as f:
            assert holdings.file_kind(f) == "writable-file", mode
    closed = open(path, "rb")
    closed.close()
    deleted = open(tmp_path / "out", "rb")
    os.unlink(tmp_path / "out")
    r, w = os.pipe()
    with os.fdopen(r, "rb") as pipe, os.fdopen(w, "wb"), deleted, open(os.devnull, "rb") as null:
        for f in (closed, deleted, pipe, null, sys.stdin, sys.stdout, io.BytesIO(b"x")):
            assert holdings.file_kind(f) is None, f


def test_readonly_files_travel_at_their_offset(data, reducers):
    path, text = data
    with open(path, "rb") as b, open(path, "rb", buffering=0) as raw, \
            open(text, encoding="latin-1") as t:
        b.seek(7)
        raw.seek(300)
        t.readline()
        ds = Holder(files=[b, raw], text=t, again=b)
        # The probe tries the repair planned for this loader; one installed for
        # another loader does not count (each is planned, and recorded, alone).
        assert not probe(ds).ok and probe(ds, planned=reopen.file_reducers()).ok
        copy = roundtrip(ds)
        try:
            assert copy.files[0] is not b and copy.again is copy.files[0]
            assert copy.files[0].read(2) == bytes([7, 8])
            assert type(copy.files[1]) is io.FileIO and copy.files[1].tell() == 300
            assert copy.text.encoding == "latin-1" and copy.text.readline() == "wörld\n"
        finally:
            for f in (copy.files[0], copy.files[1], copy.text):
                f.close()


def test_unrepairable_files_fail_as_before(data, tmp_path, reducers):
    reopen.install_reducers()  # idempotent
    with open(tmp_path / "out", "wb") as w:
        with pytest.raises(TypeError, match=cannot_pickle("BufferedWriter")):
            roundtrip(Holder(w=w))
        assert probe(Holder(w=w)).path == "dataset.w"
    r, wfd = os.pipe()
    with os.fdopen(r, "rb") as pipe, os.fdopen(wfd, "wb"), \
            pytest.raises(TypeError, match=cannot_pickle("BufferedReader")):
        roundtrip(pipe)


def test_uninstall_restores_the_default(data):
    path, _ = data
    reopen.install_reducers()
    pickling.uninstall_reducers()
    with open(path, "rb") as f, pytest.raises(TypeError, match=cannot_pickle("BufferedReader")):
        roundtrip(f)
    assert io.BufferedReader not in ForkingPickler._extra_reducers
    assert io.BufferedReader not in pickling.WorkerPickler.ours


def test_by_value_functions():
    def local(x, k=1):
        return x + k

    for fn in (lambda x: x * 2, local):
        wrapped = byvalue.by_value(fn)
        assert byvalue.by_value(wrapped) is wrapped and wrapped.function is fn
        assert probe(wrapped, "collate_fn").ok
        assert roundtrip(wrapped)(3) == fn(3)


def test_find_files_paths(data):
    path, text = data
    with open(path, "rb") as b, open(text) as t:
        ds = Holder(items=[{"f": b}], pair=(t,), t=t)
        found = holdings.find_files(ds)
        assert sorted((p, k) for p, _f, k in found) == [
            ("dataset.items[0]['f']", "readonly-file"),
            ("dataset.pair[0]", "readonly-file"),
            ("dataset.t", "readonly-file")]
        assert {f.path: f.settable for f in found}["dataset.pair[0]"] is False


def test_fork_plan_isolates_every_read_only_descriptor(data, tmp_path):
    """Whatever holds it (a tuple, a GzipFile, a text wrapper), a read-only
    file's descriptor is isolated; one open for writing stays shared; a pipe
    has no offset to keep."""
    import gzip

    from autosafe_torch.remedies import isolation

    path, text = data
    with gzip.open(tmp_path / "d.gz", "wb") as out:
        out.write(b"x" * 100)
    r, w = os.pipe()
    with open(path, "rb") as b, open(text) as t, gzip.open(tmp_path / "d.gz") as g, \
            open(tmp_path / "log", "a") as log, os.fdopen(r, "rb") as pipe, os.fdopen(w, "wb"):
        ds = Holder(pair=(t,), items=[b], gz=g, log=log, pipe=pipe, again=b)
        plan = isolation.plan({"dataset": ds})
        assert sorted(d.path for d in plan.isolate) == [
            "dataset.gz.myfileobj", "dataset.items[0]", "dataset.pair[0]"]
        assert [d.path for d in plan.shared] == ["dataset.log"]
        assert not plan.unhandled and not plan.handles


def test_find_files_through_torch_wrappers(data):
    from torch.utils.data import ChainDataset, ConcatDataset, IterableDataset, Subset

    class Stream(IterableDataset):
        def __init__(self, f):
            self.f = f

        def __iter__(self):
            return iter(())

    path, _ = data
    with open(path, "rb") as f:
        ds = ConcatDataset([Subset(Holder(f=f), [0])])
        assert [p for p, *_ in holdings.find_files(ds)] == ["dataset.datasets[0].dataset.f"]
        chain = ChainDataset([Stream(f)])
        assert [p for p, *_ in holdings.find_files(chain)] == ["dataset.datasets[0].f"]


def test_fork_blockers_are_held_locks_and_live_threads():
    used = concurrent.futures.ThreadPoolExecutor(1)
    used.submit(int).result()
    thread = threading.Thread(target=threading.Event().wait, args=(5,), daemon=True)
    held, held_elsewhere, released = threading.Lock(), threading.RLock(), threading.Event()
    ds = Holder(lock=threading.Lock(), cond=threading.Condition(), more=[threading.RLock()],
                used=used, idle=threading.Thread(target=int), held=held,
                sem=threading.Semaphore(), elsewhere=held_elsewhere)
    holder = threading.Thread(target=lambda: held_elsewhere.acquire() and released.wait(5))
    try:
        # Unheld locks are copied unheld into a forked child; a pool is rebuilt (DL208).
        assert holdings.fork_blockers(ds) == []
        held.acquire()
        ds.cond.acquire()
        holder.start()
        while not held_elsewhere.locked() if hasattr(held_elsewhere, "locked") else \
                held_elsewhere.acquire(blocking=False) and not held_elsewhere.release():
            pass
        assert dict(holdings.fork_blockers(ds)) == {
            "dataset.held": "held lock", "dataset.cond": "held condition",
            "dataset.elsewhere": "held rlock"}
        thread.start()
        assert holdings.fork_blockers(Holder(t=thread)) == [("dataset.t", "live thread")]
    finally:
        released.set()
        used.shutdown()


SPAWN_FILE = """
    import sys
    import torch
    from torch.utils.data import DataLoader, Dataset
    from autosafe_torch.recovery.rungs import pickled_for_workers
    from autosafe_torch.remedies import byvalue, pickling, reopen

    class Records(Dataset):
        def __init__(self, path):
            with open(path, "wb") as out:
                out.write(bytes(range(256)) * 8)
            self.f = open(path, "rb")
        def __len__(self):
            return 16
        def __getitem__(self, i):
            self.f.seek(i * 64)
            return torch.tensor(list(self.f.read(4)))

    if __name__ == "__main__":
        if "install" in sys.argv:
            reopen.install_reducers()
        workers = 0 if "reference" in sys.argv else 1
        loader = DataLoader(Records("records.bin"), batch_size=4, num_workers=workers)
        with pickled_for_workers(loader):  # as the shim starts a repaired loader's workers
            digest(loader)
"""


def test_spawn_dataset_with_open_file(tmp_path):
    reference = run_script(tmp_path, SPAWN_FILE, env=OFF, args=["reference"])
    assert reference.batches, reference
    broken = run_script(tmp_path, SPAWN_FILE, env=OFF, start_method="spawn")
    assert re.search(cannot_pickle("BufferedReader"), broken.stderr), broken
    fixed = run_script(tmp_path, SPAWN_FILE, env=OFF, start_method="spawn", args=["install"])
    assert fixed.batches == reference.batches, fixed


FORK_SHARED_OFFSET = """
    import os, struct, sys, time
    import torch
    from torch.utils.data import DataLoader, Dataset
    from autosafe_torch.remedies import isolation, workerinit

    REC, N = 16384, 16  # records larger than the read buffer: every seek is an lseek

    class Records(Dataset):
        def __init__(self, path):
            with open(path, "wb") as out:
                for i in range(N):
                    out.write(struct.pack("<q", i) * (REC // 8))
            self.f = open(path, "rb")
        def __len__(self):
            return N
        def __getitem__(self, i):
            self.f.seek(i * REC)
            time.sleep(0.01)  # a sibling worker seeks meanwhile
            return struct.unpack("<q", self.f.read(8))[0]

    if __name__ == "__main__":
        dataset = Records("records.bin")
        init = None
        if "isolate" in sys.argv:  # the table: taken as the workers start
            # another thread's file, open while the table is taken
            churned = open("records.bin", "rb") if "churned" in sys.argv else None
            table = isolation.DescriptorTable.take()
            if churned is not None:  # closed before the fork, its number now a pipe
                number = churned.fileno()
                churned.close()
                assert os.pipe()[0] == number
            init = workerinit.with_step(None, isolation.worker_step(table))
        loader = DataLoader(dataset, num_workers=2, worker_init_fn=init)
        got = [int(batch) for batch in loader]
        print("WRONG", sum(g != i for i, g in enumerate(got)))
        digest(loader)
"""


def test_fork_shared_offset_gives_wrong_samples_until_isolated(tmp_path):
    broken = run_script(tmp_path, FORK_SHARED_OFFSET, env=OFF, start_method="fork")
    assert "WRONG" in broken.stdout, broken
    assert "WRONG 0" not in broken.stdout, broken
    fixed = run_script(tmp_path, FORK_SHARED_OFFSET, env=OFF, start_method="fork",
                       args=["isolate"])
    assert "WRONG 0" in fixed.stdout, fixed


def test_a_file_closed_after_the_table_was_taken_is_not_a_forked_workers_to_privatize(tmp_path):
    """A thread that closes a file between the table and the fork (the warm server
    started ahead, for a loader the plan then forks): the worker did not inherit
    it, so there is no offset to give; the number, now another file, is left as
    it is, and the files still open are privatized as ever."""
    fixed = run_script(tmp_path, FORK_SHARED_OFFSET, env=OFF, start_method="fork",
                       args=["isolate", "churned"])
    assert "WRONG 0" in fixed.stdout, fixed


INTERACTIVE_CLASS = """
import torch
from torch.utils.data import DataLoader, Dataset
from autosafe_torch.recovery.rungs import pickled_for_workers
from autosafe_torch.remedies import byvalue, pickling, reopen

class DS(Dataset):
    def __init__(self):
        self.t = torch.arange(6.0)
    def __len__(self):
        return 6
    def __getitem__(self, i):
        return self.t[i] * 2

if BY_VALUE:
    byvalue.register_by_value_class(DS)
loader = DataLoader(DS(), batch_size=2, num_workers=1, multiprocessing_context="spawn",
                    collate_fn=byvalue.by_value(lambda b: torch.stack(b).sum()))
with pickled_for_workers(loader):  # as the shim starts a repaired loader's workers
    print("SUM", float(sum(loader)))
"""


@pytest.mark.parametrize("by_value", [False, True])
def test_interactive_main_class_travels_by_value(by_value):
    code = "BY_VALUE = %s\n%s" % (by_value, INTERACTIVE_CLASS)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **OFF})
    if by_value:
        assert "SUM 30.0" in proc.stdout, proc.stderr
    else:
        assert re.search("Can't get attribute 'DS' on " + CHILD_MAIN, proc.stderr)


def test_interactive_probe_sees_registered_class():
    code = textwrap.dedent("""
        from autosafe_torch.remedies import byvalue, reopen
        from autosafe_torch.inspection.probe import probe
        class DS: pass
        before = probe(DS()).ok
        byvalue.register_by_value_class(DS)
        installed = probe(DS()).ok  # installed for another loader: not this one's repair
        print("PROBE", before, installed, probe(DS(), planned=byvalue.class_reducers((DS,))).ok)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env={**os.environ, **OFF})
    assert "PROBE False False True" in proc.stdout, proc.stderr


def test_a_dataset_that_reopens_per_process_is_recognised(tmp_path):
    """DL207 leaves alone a dataset that asks os.getpid() to reopen by itself;
    one that seeks a file opened in __init__ is not."""
    import os

    path = tmp_path / "data.bin"
    path.write_bytes(bytes(range(64)))

    class PerProcess:
        def __init__(self):
            self.f, self.pid = open(path, "rb"), os.getpid()

        def __getitem__(self, i):
            if self.pid != os.getpid():
                self.f, self.pid = open(path, "rb"), os.getpid()
            self.f.seek(i)
            return self.f.read(1)

    class Shared:
        def __init__(self):
            self.f = open(path, "rb")

        def __getitem__(self, i):
            self.f.seek(i)
            return self.f.read(1)

    assert holdings.reopens_per_process(PerProcess())
    assert not holdings.reopens_per_process(Shared())


@pytest.mark.parametrize("kind, strategy", [
    ("sqlite", "repair: reopen read-only files by path in each worker"),
    pytest.param("text-lf", "repair: reopen read-only files by path in each worker",
                 marks=pytest.mark.heavy),
    # as on macOS: no fork rung; built again by its constructor's call in each worker
    ("text-crlf", "repair: build the dataset again in each worker"),
    # read after construction: no build gives it (refused here, before any worker),
    # and no copy for emulated workers
    ("text-crlf-read", None),
])
def test_sqlite_and_text_files_reopened_only_where_exact(tmp_path, tmp_path_factory, kind,
                                                        strategy):
    """A read-only sqlite connection reopens by path; a text file too, unless it
    holds carriage returns (newline='' could not be honoured: not reopened). As
    on macOS, the dataset holding the CRLF file is built again in each worker;
    once the parent read from it, no rung is exact (a new build starts
    elsewhere, emulated workers would need a copy of it each, with its newline
    mode): a clear error, not a run."""

    from support import run_scenario

    data = kind.replace("-read", "")  # the reference: no workers (once in the whole test run)
    ref = result_once_per_run(tmp_path_factory, "sqlite-and-text-reference-" + data, lambda: (
        run_scenario(tmp_path_factory.mktemp("reference"), "sqlite_and_text.py",
                     args=(data, "0"))))
    assert ref.rc == 0, ref
    bad = run_scenario(tmp_path, "sqlite_and_text.py", start_method="spawn", args=(kind, "2"))
    assert bad.rc != 0 and "pickle" in bad.stderr, bad
    log = tmp_path / "log.jsonl"
    good = run_scenario(tmp_path, "sqlite_and_text.py", activation="env", args=(kind, "2"),
                        env={"AUTOSAFE_TORCH_AS": "macos", "AUTOSAFE_TORCH_LOG_FILE": str(log)})
    records = json_log(log)
    if strategy is None:
        assert good.rc != 0 and "NoExactRung" in good.stderr and not good.batches, good
        assert "its newline mode cannot be read back" in good.stderr, good
        # why the rung above was refused
        assert "dataset (Lines) cannot be built again in a worker: its attribute f (a file) " \
            "was read after construction" in good.stderr
        assert [(r["code"], r["action"]) for r in records] == [("DL201", "failed")], records
        return
    assert good.rc == 0 and good.batches == ref.batches, good
    assert {r["strategy"] for r in records if r["code"] != "DL209"} == {strategy}


def _logged(log):

    return json_log(log)


@pytest.mark.parametrize("kind, unpicklable", [
    ("lmdb", "'Environment'"),
    pytest.param("video", "'cv2.VideoCapture'", marks=pytest.mark.heavy)])  # 19 s: make heavy
@pytest.mark.rule("DL212")
def test_native_handles_reopened_by_path_in_each_worker(tmp_path, kind, unpicklable):
    """A read-only lmdb environment, or a cv2.VideoCapture of a file, held by a
    dataset. Spawn cannot pickle it (DL201 reopens it by path in each worker);
    fork must not share it (DL212): the capture, which decoded in the parent,
    hangs its forked workers, and LMDB forbids the parent's environment in a
    child. With a lock beside it (as on macOS: no fork rung) the emulated
    workers share the environment and reopen the capture. Every repaired run
    gives the batches of num_workers=0."""
    from support import run_scenario

    def run(*args, log=None, **kw):
        env = {"AUTOSAFE_TORCH_LOG_FILE": str(log)} if log else None
        if log:
            env["AUTOSAFE_TORCH_AS"] = kw.pop("platform", "linux")
        return run_scenario(tmp_path, "native_handles.py", args=(kind,) + args, env=env, **kw)

    ref = run("0")
    assert ref.rc == 0 and ref.batches, ref
    bad = run("2", start_method="spawn")
    assert bad.rc != 0 and "cannot pickle %s object" % unpicklable in bad.stderr, bad
    log = tmp_path / "spawn.jsonl"
    good = run("2", log=log, activation="env", platform="macos")
    assert good.batches == ref.batches, good
    assert {(r["code"], r["strategy"]) for r in _logged(log)} >= {
        ("DL201", "repair: reopen read-only files by path in each worker")}

    bad = run("2", "bounded", start_method="fork")
    if kind == "video":
        assert "DataLoader timed out after 6 seconds" in bad.stderr, bad
    else:
        assert bad.stdout.count("OWN_ENV False") == 2, bad
    log = tmp_path / "fork.jsonl"
    good = run("2", "bounded", log=log, activation="env", start_method="fork")
    assert good.batches == ref.batches, good
    assert kind == "video" or good.stdout.count("OWN_ENV True") == 2, good
    assert ("DL212", "reopen in each worker") in {(r["code"], r["strategy"])
                                                  for r in _logged(log)}

    log = tmp_path / "locked.jsonl"
    locked = run("2", "lock", log=log, activation="env", platform="macos")
    assert locked.batches == ref.batches, locked
    assert ("DL201", "repair: reopen read-only files by path and new unlocked locks in each "
            "worker") in {(r["code"], r["strategy"]) for r in _logged(log)}

    log = tmp_path / "emulated.jsonl"
    emulated = run("2", "stream", log=log, activation="env", platform="macos")
    assert emulated.batches == ref.batches, emulated
    assert "emulated workers (in process)" in {r["strategy"] for r in _logged(log)}


def test_read_write_lmdb_reopened_read_only_and_said_so(tmp_path):
    """An lmdb environment opened read-write (py-lmdb's default) that the
    dataset only reads: reopened read-only in each worker, under spawn (it does
    not pickle) and under fork (LMDB forbids the parent's in a child); the
    record says so. The batches are those of num_workers=0."""
    from support import run_scenario

    def run(*args, log=None, **kw):
        env = {"AUTOSAFE_TORCH_LOG_FILE": str(log), "AUTOSAFE_TORCH_AS": kw.pop("platform")} \
            if log else None
        return run_scenario(tmp_path, "native_handles.py", args=("lmdb",) + args + ("rw",),
                            env=env, **kw)

    ref = run("0")
    assert ref.rc == 0 and ref.batches, ref
    for platform, method, code in (("macos", None, "DL201"), ("linux", "fork", "DL212")):
        log = tmp_path / ("%s.jsonl" % platform)
        good = run("2", log=log, activation="env", platform=platform, start_method=method)
        assert good.batches == ref.batches, good
        assert method is None or good.stdout.count("OWN_ENV True") == 2, good
        (record,) = [r for r in _logged(log) if r["code"] == code]
        assert "opened read-write, reopened read-only" in record["why"], record


def test_native_handles_as_holdings_see_them(tmp_path):
    """What can be reopened: an lmdb environment (read-only, even one opened for writing),
    a capture of a file whose arguments the cv2 patch recorded (not one that
    opened nothing); the class stays cv2.VideoCapture, the capture reopens at
    its frame, and unpatching puts the native methods back."""
    import cv2
    import lmdb
    import numpy as np

    from autosafe_torch.patches import cv2 as cv2_patch

    path = str(tmp_path / "clip.avi")
    out = cv2.VideoWriter(path, cv2.VideoWriter_fourcc(*"MJPG"), 10, (32, 24))
    for i in range(6):
        out.write(np.full((24, 32, 3), i * 40, np.uint8))
    out.release()
    native, patched = cv2.VideoCapture, cv2_patch.capture_recorded(cv2)
    cv2_patch.record_captures(cv2)
    try:
        assert cv2.VideoCapture is native
        cap, empty = cv2.VideoCapture(path), cv2.VideoCapture()
        cap.read(), cap.read()
        assert holdings.file_kind(cap) == holdings.READONLY
        assert holdings.is_file_object(empty) and holdings.file_kind(empty) is None
        again = reopen.reopen(cap)
        assert again.get(cv2.CAP_PROP_POS_FRAMES) == 2
        assert (again.read()[1] == cap.read()[1]).all()
    finally:
        if not patched:
            cv2_patch.unrecord_captures(cv2)
    assert patched or not cv2_patch.capture_recorded(cv2)

    with lmdb.open(str(tmp_path / "db"), map_size=1 << 20) as writable:
        # Opened read-write (py-lmdb's default), reopened read-only, and said so.
        assert holdings.file_kind(writable) == holdings.READONLY
        assert holdings.fork_unsafe(writable) == holdings.LMDB_ENV
        assert reopen._reopen_args(writable)[2]["readonly"] is True
        assert "opened read-write, reopened read-only" in reopen.read_only_note(writable)
    with lmdb.open(str(tmp_path / "db"), readonly=True, lock=False) as env:
        assert holdings.file_kind(env) == holdings.READONLY
        assert reopen._reopen_args(env)[2]["readonly"] is True
