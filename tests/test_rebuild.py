"""The rebuild rung's parts (remedies/rebuild.py, patches/datasets.py), in process:
what the program's construction records, what the training process refuses
without building anything, and what a worker's build checks. The end-to-end
runs (real spawn workers, as on macOS and on Linux) are in tests/test_holders.py
and tests/test_constructors.py."""

import inspect
import os
import pickle
import random
import socket
import threading

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from autosafe_torch import patches
from autosafe_torch.inspection import digest, opened
from autosafe_torch.patches import datasets as dataset_patch
from autosafe_torch.remedies import rebuild
from support import run_script

BUILT = []  # every construction, in the order the constructors ran


class Reader(Dataset):
    def __init__(self, path, scale=1.0):
        BUILT.append(("Reader", path))
        self.path, self.scale = path, scale
        self.f = open(path, "rb")


class Shuffled(Dataset):
    def __init__(self, paths):
        BUILT.append(("Shuffled", len(paths)))
        order = list(paths)
        random.shuffle(order)
        self.files = [open(p, "rb") for p in order]


class Writer(Dataset):
    def __init__(self, path):
        self.path = path
        try:
            with open(path + ".cache", "w") as f:
                f.write("x")
        except Exception:  # a constructor that swallows errors still counts
            pass


class Noisy(Dataset):
    def __init__(self, path):
        print("loading", path)
        os.write(2, b"native noise\n")
        self.path = path


class Connected(Dataset):
    def __init__(self):
        self.sock = socket.socket()


class Converted(Dataset):
    """Keeps what it made of its argument, not the argument."""

    def __init__(self, frame):
        self.values = frame.sum()


class Child(Reader):
    def __init__(self, path):
        super().__init__(path, scale=2.0)


@pytest.fixture
def recorded():
    """Dataset constructions recorded, as under the shim; afterwards what this
    fixture replaced is put back, and nothing else (another test's activation
    keeps its patches)."""
    before = set(patches._originals)
    dataset_patch.patch(torch)
    BUILT.clear()
    yield
    for key in set(patches._originals) - before:
        owner, name = key
        original = patches._originals.pop(key)
        if original is patches._MISSING:
            delattr(owner, name)
        else:
            setattr(owner, name, original)
    if (Dataset, "__new__") not in before:
        dataset_patch.unpatch()  # a __new__ that does what Dataset's did


@pytest.fixture
def data(tmp_path):
    paths = []
    for k in range(4):
        path = tmp_path / ("part%d.bin" % k)
        path.write_bytes(bytes(range(k, 64 + k)))
        paths.append(str(path))
    return paths


class Paired(Dataset):
    """Opens ``a``, then, while a thread of the shim's closes ``held`` (a
    descriptor below ``a``'s) and another begins a stretch of its own, ``b``."""

    def __init__(self, a, b, held, threads):
        self.a = open(a, "rb")
        for thread in threads:
            thread.start()
        threads[0].join(5)  # the close: deferred, it returns at once
        threads[1].join(0.3)  # the stretch: it waits for this constructor's end
        self.waited = threads[1].is_alive()
        self.b = open(b, "rb")


def test_a_thread_of_ours_waits_for_a_constructor_being_recorded(recorded, data):
    """What a thread of the shim's closes while the program's constructor is
    recorded is closed at its end, and a stretch in which it opens and closes
    descriptors begins there (opened.TURNS): a number freed meanwhile would go
    to the constructor's next file, below its first, and the record would hold
    its files in an order it never opened them in (with a plain os.close here,
    ``b`` comes first)."""
    held = os.open(os.devnull, os.O_RDONLY)
    began = []

    def stretch():
        with opened.TURNS.ours():
            began.append(os.path.exists("/proc/self/fd/%d" % held))

    threads = [threading.Thread(target=opened.TURNS.close, args=(held,)),
               threading.Thread(target=stretch)]
    ds = Paired(data[0], data[1], held, threads)
    threads[1].join(5)
    assert [o.path for o in rebuild.construction_of(ds).opened] == [data[0], data[1]]
    assert ds.waited and began == [False]  # closed by the constructor's end, before it
    with pytest.raises(OSError):
        os.fstat(held)


def sent(ds):
    """``ds`` as the training process sends it to a worker (the rebuild planned),
    and as that worker builds and checks it."""
    rebuild.install([ds])
    func, args = rebuild.reduce_rebuilt(ds)
    assert func is rebuild.rebuilt_in_worker
    cls, call_args, kwargs, expected = args
    return func(cls, call_args, kwargs, pickle.loads(pickle.dumps(expected)))


def test_the_call_is_recorded_by_reference_with_what_it_opened(recorded, data):
    scale = np.float32(2.0)  # not a plain value: kept all the same
    ds = Reader(data[0], scale=scale)
    made = rebuild.construction_of(ds)
    cls, args, kwargs = made.call()
    assert cls is Reader and args == (data[0],) and kwargs["scale"] is scale  # not a copy
    assert [(o.kind, o.path) for o in made.opened] == [("file", data[0])]
    assert made.rng is None  # it drew nothing
    assert rebuild.refusal(ds) is None


def test_only_the_outer_call_measures_and_the_class_reads_as_before(recorded, data):
    ds = Child(data[1])
    assert rebuild.construction_of(ds).call() == (Child, (data[1],), {})
    assert [o.path for o in rebuild.construction_of(ds).opened] == [data[1]]
    assert inspect.isfunction(Reader.__init__) and Reader.__init__.__name__ == "__init__"
    assert str(inspect.signature(Reader)) == "(path, scale=1.0)"
    cloudpickle = pytest.importorskip("cloudpickle")
    assert "MeasuredInit" not in str(cloudpickle.dumps(Reader))


def test_an_argument_the_program_let_go_is_not_kept_alive(recorded):
    pd = pytest.importorskip("pandas")
    ds = Converted(pd.DataFrame({"a": [1, 2, 3]}))  # the frame is freed right here
    assert "its argument 0 (a DataFrame) was freed by the program" in rebuild.refusal(ds)


def test_what_changed_after_construction_is_refused_by_name(recorded, data):
    ds = Reader(data[0])
    ds.cache = {0: b"peeked"}
    assert rebuild.refusal(ds) == "its attribute cache was set after construction"
    ds2 = Reader(data[0])
    ds2.scale = 3.0
    assert "its attribute scale was set again after construction" in rebuild.refusal(ds2)


def test_a_handle_over_what_is_no_file_is_refused(recorded):
    """Seen where the build is alone in its process: the worker (in the training
    process another thread may open a pipe meanwhile: a warm server starting)."""
    ds = Connected()
    try:
        rebuild.install([ds])
        again = sent(ds)
        with pytest.raises(Exception, match="its constructor opened a socket, and a handle "
                           "over what is no file is not made again"):
            again[0]
    finally:
        ds.sock.close()


def test_a_worker_builds_the_same_dataset_from_the_same_draws(recorded, data):
    random.seed(7)
    random.random()  # the program drew before constructing
    ds = Shuffled(data)
    order = [f.name for f in ds.files]
    assert rebuild.construction_of(ds).rng is not None
    random.seed(99)  # the worker's own state: put back after its build
    state = random.getstate()
    again = sent(ds)
    assert [f.name for f in again.files] == order
    assert random.getstate() == state
    assert BUILT == [("Shuffled", 4), ("Shuffled", 4)]


def test_a_worker_that_opens_other_files_fails_and_names_them(recorded, data):
    ds = Reader(data[0])
    rebuild.install([ds])
    func, args = rebuild.reduce_rebuilt(ds)
    cls, call_args, kwargs, expected = args
    again = func(cls, (data[1],), kwargs, expected)  # as module state changed by main() does
    with pytest.raises(Exception, match="it opened part1.bin, the training process part0.bin"):
        again[0]


def test_another_order_of_the_same_files_is_named(recorded, data):
    random.seed(1)
    ds = Shuffled(data)
    rebuild.install([ds])
    _func, (cls, args, kwargs, expected) = rebuild.reduce_rebuilt(ds)
    expected.rng = None  # as if the worker drew from its own generator
    random.seed(2)  # which shuffles these four otherwise (seeds 1 and 2)
    again = rebuild.rebuilt_in_worker(cls, args, kwargs, expected)
    with pytest.raises(Exception, match="it opened its files in another order"):
        len(again)


def test_a_changed_file_or_attribute_fails_the_worker_before_a_batch(recorded, data):
    ds = Reader(data[0])
    rebuild.install([ds])
    _func, (cls, args, kwargs, expected) = rebuild.reduce_rebuilt(ds)
    with open(data[0], "ab") as f:
        f.write(b"more")
    again = rebuild.rebuilt_in_worker(cls, args, kwargs, expected)
    with pytest.raises(Exception, match="part0.bin changed since the training process opened"):
        again[0]
    fresh = Reader(data[1])
    fresh.scale_cache = [1]  # a peek filled a cache: the worker's build has none
    rebuild.install([fresh])
    _func, (cls, args, kwargs, expected) = rebuild.reduce_rebuilt(fresh)
    again = rebuild.rebuilt_in_worker(cls, args, kwargs, expected)
    with pytest.raises(Exception, match="has no attribute scale_cache"):
        iter(again)


def test_a_constructor_that_writes_files_is_refused_and_writes_nothing(recorded, tmp_path):
    path = str(tmp_path / "w")
    ds = Writer(path)
    os.remove(path + ".cache")
    rebuild.install([ds])
    again = sent(ds)
    with pytest.raises(Exception, match=r"its constructor writes files \(opens w.cache"):
        again[0]
    assert not os.path.exists(path + ".cache")  # the worker's write was refused


def test_a_worker_build_prints_nothing(recorded, tmp_path, capfd):
    ds = Noisy(str(tmp_path))
    capfd.readouterr()
    assert isinstance(sent(ds), Noisy)
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_the_program_constructs_once_and_nothing_is_built_to_decide(recorded, data):
    ds = Reader(data[0])
    assert rebuild.refusal(ds) is None
    from autosafe_torch.inspection.probe import probe

    assert not probe(ds, "dataset").ok
    # the plan's probe sends the call, builds nothing
    assert probe(ds, "dataset", rebuild.planned_reducers([ds])).ok
    assert BUILT == [("Reader", data[0])]  # noqa: SIM300 - BUILT is a list the test fills


def test_datasets_take_their_arguments_once_the_shim_is_off(recorded, data):
    """``deactivate()`` (``%unload_ext``) puts back a ``__new__`` that does what
    Dataset's did: CPython keeps the slot made for ours, which deleting it
    would leave refusing every subclass's arguments."""
    original = patches._originals.pop((Dataset, "__new__"))
    if original is patches._MISSING:
        delattr(Dataset, "__new__")
    dataset_patch.unpatch()
    assert len(torch.utils.data.TensorDataset(torch.zeros(3))) == 3
    assert Reader(data[0]).path == data[0]
    with pytest.raises(TypeError, match=r"takes no arguments"):
        type("Bare", (Dataset,), {})(1)


def test_digest_does_not_depend_on_string_hashes(tmp_path):
    """A spawned worker hashes strings with another seed: sets, in a worker's
    digest and the parent's, in one order (pandas' reader holds some)."""
    script = ("from autosafe_torch.inspection import digest\n"
              "class S:\n    def __init__(self):\n"
              "        self.names = {'a', 'b', 'NaN', 'null', 'N/A', '#N/A'}\n"
              "        self.kept = [frozenset(self.names)]\n"
              "print('DIGEST', digest.attribute_digests(S()))\n")
    seen = set()
    for seed in ("1", "2", "3"):
        result = run_script(tmp_path, script, env={"PYTHONHASHSEED": seed})
        assert result.rc == 0, result
        seen.add(result.stdout.split("DIGEST", 1)[1])
    assert len(seen) == 1


def test_digest_reads_an_imagenet_sized_index_whole():
    samples = [("/data/n%08d/%07d.JPEG" % (i % 1000, i), i % 1000) for i in range(1_281_167)]
    before = digest.digest(samples)
    samples[1_281_000] = ("/data/other.JPEG", 3)  # one item past any cap
    assert digest.digest(samples) != before


def test_recording_keeps_datasets_as_they_were(tmp_path):
    """Dataset.__new__ under the shim: a mixin's own __new__ still runs, a class
    without __init__ refuses arguments as before, datasets pickle as before."""
    result = run_script(tmp_path, """
        import pickle
        from torch.utils.data import Dataset, IterableDataset, TensorDataset
        import torch

        class Counted:
            made = 0
            def __new__(cls, *args, **kwargs):
                Counted.made += 1
                return super().__new__(cls)

        class DS(Dataset, Counted):
            def __init__(self, n):
                self.n = n

        class Bare(Dataset):
            pass

        ds = DS(3)
        print("MIXIN", Counted.made, ds.n)
        try:
            Bare(1)
        except TypeError as exc:
            print("BARE", exc)
        print("PICKLE", pickle.loads(pickle.dumps(ds)).n, len(TensorDataset(torch.ones(2))))
        from autosafe_torch.remedies import rebuild
        print("RECORDED", rebuild.construction_of(ds) is not None)
    """, activation="import")
    assert result.rc == 0, result
    assert "MIXIN 1 3" in result.stdout and "BARE Bare() takes no arguments" in result.stdout
    assert "PICKLE 3 2" in result.stdout and "RECORDED True" in result.stdout
