import functools
import multiprocessing.reduction
import os
import re
import subprocess
import sys
import textwrap
import tracemalloc
import warnings

import torch
from torch.utils.data import ConcatDataset, Dataset, Subset, TensorDataset

from autosafe_torch.inspection.probe import probe, sent_table
from autosafe_torch.remedies import pickling
from support import CHILD_MAIN, LOCAL_OBJECT, cannot_pickle, clean_env, run_script


class Holder(Dataset):
    def __init__(self, **attrs):
        self.__dict__.update(attrs)

    def __len__(self):
        return 1

    def __getitem__(self, i):
        return i


class Slotted:
    __slots__ = ("conn", "name")


class Unpicklable:
    def __reduce__(self):
        raise TypeError("cannot pickle 'Unpicklable' object")


def test_picklable_dataset_is_ok_and_counts_objects():
    result = probe(Holder(x=[1, 2, 3], t=torch.zeros(3)))
    assert result.ok and result.path == "dataset" and result.error is None
    # the objects that reached Python (the holder, the tensor): plain values are read in C
    assert result.objects >= 2


def test_path_to_the_innermost_file(tmp_path):
    (tmp_path / "f").write_bytes(b"x")
    inner = Slotted()
    inner.name = "n"
    with open(tmp_path / "f", "rb") as f:
        inner.conn = f
        ds = Holder(items=[{"a": 1}, (2, 3), 4, Holder(conn=f)], other=inner)
        result = probe(ds)
        assert not result.ok
        assert result.path == "dataset.items[3].conn"
        assert re.fullmatch(cannot_pickle("BufferedReader"), result.error), result.error
        assert result.value is f
        assert probe(Holder(s=inner)).path == "dataset.s.conn"
        assert probe({"k": [f]}, "x").path == "x['k'][0]"


def test_wrapped_datasets_are_descended(tmp_path):
    (tmp_path / "f").write_bytes(b"x")
    with open(tmp_path / "f", "rb") as f:
        ds = ConcatDataset([TensorDataset(torch.zeros(2)), Subset(Holder(f=f), [0])])
        assert probe(ds).path == "dataset.datasets[1].dataset.f"


def test_lambdas_and_local_functions_fail_like_pickle():
    def local(batch):
        return batch

    result = probe(lambda b: b, "collate_fn")
    assert result.path == "collate_fn"
    assert re.match(LOCAL_OBJECT, result.error) and "<lambda>" in result.error
    result = probe(functools.partial(local, 1), "worker_init_fn")
    assert result.path == "worker_init_fn.func"
    assert result.error.endswith(
        "test_lambdas_and_local_functions_fail_like_pickle.<locals>.local'")
    assert probe(Holder(transform=local)).path == "dataset.transform"


def test_cycles_do_not_hide_the_culprit(tmp_path):
    (tmp_path / "f").write_bytes(b"x")
    with open(tmp_path / "f", "rb") as f:
        ds = Holder()
        ds.helper = Holder(owner=ds)
        ds.f = f
        assert probe(ds).path == "dataset.f"


def test_reducers_registered_with_forking_pickler_count():
    assert not probe(Holder(u=Unpicklable())).ok
    multiprocessing.reduction.ForkingPickler.register(Unpicklable, lambda u: (Unpicklable, ()))
    try:
        assert probe(Holder(u=Unpicklable())).ok
    finally:
        del multiprocessing.reduction.ForkingPickler._extra_reducers[Unpicklable]


def test_the_probe_pickles_with_the_workers_table():
    """Probing is sending: the probe's dispatch table is the one our workers' start
    pickles with (``WorkerPickler``), a planned repair's reducers as if installed,
    torch's included (Python 3.9: and a fork context's locks refused, as 3.10's
    pickling does); and it shares no storage, which torch's reducers would do."""
    def workers_table():
        return pickling.WorkerPickler(open(os.devnull, "wb")).dispatch_table

    def same(table, workers):
        return table == workers if sys.version_info >= (3, 10) else workers.items() <= table.items()

    planned = {Unpicklable: lambda u: (Unpicklable, ())}
    installed = dict(pickling.WorkerPickler.ours)  # an earlier test's repairs, in this process
    pickling.WorkerPickler.ours.clear()
    try:
        assert same(sent_table(), workers_table())
        pickling.install(planned)
        assert same(sent_table(planned), workers_table())
    finally:
        pickling.WorkerPickler.ours.clear()
        pickling.WorkerPickler.ours.update(installed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # TypedStorage is deprecated
        held = [torch.ones(4).untyped_storage(), torch.ones(4).storage(), torch.FloatStorage(4)]
    assert probe(Holder(held=held)).ok
    assert not any(s.is_shared() for s in held)
    assert multiprocessing.reduction.ForkingPickler.dumps(held[0]) and held[0].is_shared()


def test_non_leaf_tensor_requiring_grad_fails_like_torch():
    t = torch.ones(2, requires_grad=True) * 2
    assert "Cowardly refusing" in probe(Holder(t=t)).error


def test_tensor_bytes_are_never_serialized_nor_shared():
    # 1 GB of tensors, never filled: only the probe's own structures count.
    big = TensorDataset(*[torch.empty(64 * 1024 * 1024) for _ in range(4)])
    many = Holder(items=[torch.empty(256 * 1024) for _ in range(1000)])
    for ds in (big, many):
        probe(ds)  # first call: lazy imports
        tracemalloc.start()
        try:
            result = probe(ds)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert result.ok and peak < 1_000_000, peak
    assert not big.tensors[0].is_shared()
    assert probe(Holder(b=b"x" * (8 << 20))).ok


def test_interactive_main_only_where_the_child_cannot_import_it(tmp_path):
    """A script or ``-m`` module can be re-imported by a spawned child;
    ``-c`` and stdin cannot (a subprocess each: pytest's own ``__main__``
    differs by how it was started, e.g. under pytest-xdist it is ``-c``)."""
    (tmp_path / "showmain.py").write_text(
        "from autosafe_torch.inspection.mainmodule import interactive_main\n"
        "print(interactive_main())\n")
    code = (tmp_path / "showmain.py").read_text()
    env = clean_env({"PYTHONPATH": str(tmp_path)})
    seen = {}
    for how, args, stdin in (("script", ["showmain.py"], None), ("-m", ["-m", "showmain"], None),
                             ("-c", ["-c", code], None), ("stdin", ["-"], code)):
        proc = subprocess.run([sys.executable] + args, cwd=tmp_path, env=env, input=stdin,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        seen[how] = proc.stdout.strip()
    assert seen == {"script": "False", "-m": "False", "-c": "True", "stdin": "True"}


def test_interactive_main_classes_fail_as_in_the_child():
    code = textwrap.dedent("""
        from autosafe_torch.inspection.mainmodule import interactive_main
        from autosafe_torch.inspection.probe import probe
        class DS: pass
        def fn(): pass
        print(interactive_main(), probe(DS()).error, '|', probe([fn]).path)
    """)
    env = {**os.environ, "AUTOSAFE_TORCH": "0"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, env=env).stdout
    assert re.search(r"True Can't get attribute 'DS' on %s \| dataset\[0\]" % CHILD_MAIN, out)


def test_class_under_main_guard_fails_with_the_childs_error(tmp_path):
    result = run_script(tmp_path, """
        import torch
        from torch.utils.data import DataLoader, Dataset
        from autosafe_torch.inspection.probe import probe

        class Fine(Dataset):
            def __len__(self): return 2
            def __getitem__(self, i): return i

        if __name__ == "__main__":
            class Guarded(Fine):
                pass
            print("FINE", probe(Fine()).ok)
            print("PROBE", probe(Guarded()).error)
            digest(DataLoader(Guarded(), num_workers=1))
    """, start_method="spawn", timeout=120, env={"AUTOSAFE_TORCH": "0"})
    assert "FINE True" in result.stdout, result
    predicted = result.stdout.split("PROBE ", 1)[1].splitlines()[0]
    assert predicted.startswith("Can't get attribute 'Guarded' on <module '__mp_main__'")
    assert predicted in result.stderr, result


def test_multiprocessing_objects_travel_as_at_process_start():
    """A Queue, Lock, Semaphore, Value or Event refuses to pickle outside
    process start, and travels fine to a spawned child: not a hazard. A lock
    of the threading module still is; so is a SemLock made by a fork context
    (multiprocessing itself refuses to send it to a spawn child)."""
    import multiprocessing
    import threading

    ctx = multiprocessing.get_context("spawn")
    travels = Holder(q=ctx.Queue(), lock=ctx.Lock(), sem=ctx.Semaphore(2), value=ctx.Value("i", 0),
                     event=ctx.Event())
    assert probe(travels).ok, probe(travels)
    assert not probe(Holder(lock=threading.Lock())).ok
    if "fork" in multiprocessing.get_all_start_methods():
        forked = probe(Holder(lock=multiprocessing.get_context("fork").Lock()))
        assert not forked.ok and "fork context" in forked.error
    # the probe leaves no spawning state behind
    from multiprocessing import context
    assert context.get_spawning_popen() is None
