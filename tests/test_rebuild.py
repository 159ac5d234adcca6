"""The rebuild rung's parts (remedies/rebuild.py, patches/datasets.py): what is
recorded, what the check accepts and refuses, and that checking leaves the
program as it was. The end-to-end runs are in tests/test_holders.py."""

import os
import random

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from autosafe_torch.remedies import rebuild
from support import run_script


class Reader(Dataset):
    def __init__(self, path, scale=1.0):
        self.path, self.scale = path, scale
        self.f = open(path, "rb")


class Writer(Dataset):
    def __init__(self, path):
        self.path = path
        try:
            with open(path + ".cache", "w") as f:
                f.write("x")
        except Exception:  # a constructor that swallows errors still counts
            pass


class Drawn(Dataset):
    def __init__(self, n):
        self.order = torch.randperm(n)
        self.noise = random.random() + float(np.random.rand())


class Noisy(Dataset):
    def __init__(self, path):
        print("loading", path)
        self.path = path


def built(cls, *args, **kwargs):
    obj = cls(*args, **kwargs)
    rebuild.record(obj, cls, args, kwargs)
    return obj


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "data.bin"
    path.write_bytes(bytes(range(64)))
    return str(path)


def test_plain_arguments_are_recorded_objects_are_not(data):
    ds = built(Reader, data, scale=2.0)
    assert rebuild.recipe_of(ds) == (Reader, (data,), {"scale": 2.0})
    other = built(Reader, data, scale=torch.ones(3))  # a tensor: kept alive, no recipe
    assert rebuild.recipe_of(other) is None


def test_a_faithful_constructor_is_approved_and_rebuilt(data):
    ds = built(Reader, data)
    recipe, why = rebuild.approve(ds)
    assert why is None and recipe.cls is Reader
    again = rebuild.rebuilt_in_worker(recipe.cls, recipe.args, recipe.kwargs, recipe.digest)
    assert again.path == ds.path and again.f.read() == bytes(range(64))


def test_what_changed_after_construction_is_refused(data):
    ds = built(Reader, data)
    ds.f.read(8)  # the parent read: a new file would start elsewhere
    recipe, why = rebuild.approve(ds)
    assert recipe is None and "holds other values" in why
    ds2 = built(Reader, data)
    ds2.scale = 3.0  # set after construction
    assert rebuild.approve(ds2)[0] is None


def test_a_constructor_that_writes_files_is_refused_and_writes_nothing(tmp_path, data):
    path = str(tmp_path / "w")
    ds = built(Writer, path)
    os.remove(path + ".cache")
    recipe, why = rebuild.approve(ds)
    assert recipe is None and "writes files" in why
    assert not os.path.exists(path + ".cache")  # the check's write was refused


def test_a_random_constructor_is_refused_and_the_generators_are_put_back():
    torch.manual_seed(1)
    ds = built(Drawn, 10)
    states = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state())
    recipe, why = rebuild.approve(ds)
    assert recipe is None and "random" in why
    assert random.getstate() == states[0]
    assert (np.random.get_state()[1] == states[1]).all()
    assert torch.equal(torch.get_rng_state(), states[2])


def test_the_check_prints_nothing(capsys, tmp_path):
    ds = built(Noisy, str(tmp_path))
    capsys.readouterr()
    assert rebuild.approve(ds)[0] is not None
    assert capsys.readouterr().out == ""


def test_a_changed_file_fails_the_worker_loudly(tmp_path, data):
    ds = built(Reader, data)
    recipe, _ = rebuild.approve(ds)
    with open(data, "ab") as f:
        f.write(b"more")
    with pytest.raises(rebuild.RebuildFailed, match="holds other values"):
        rebuild.rebuilt_in_worker(recipe.cls, recipe.args, recipe.kwargs, recipe.digest)


def test_digest_does_not_depend_on_string_hashes(tmp_path):
    """A spawned worker hashes strings with another seed: sets, in a worker's
    digest and the parent's, in one order (pandas' reader holds some)."""
    script = ("from autosafe_torch.remedies import rebuild\n"
              "class S:\n    def __init__(self):\n"
              "        self.names = {'a', 'b', 'NaN', 'null', 'N/A', '#N/A'}\n"
              "        self.kept = [frozenset(self.names)]\n"
              "print('DIGEST', rebuild.digest(S()))\n")
    seen = set()
    for seed in ("1", "2", "3"):
        result = run_script(tmp_path, script, env={"PYTHONHASHSEED": seed})
        assert result.rc == 0, result
        seen.add(result.stdout.split()[1])
    assert len(seen) == 1


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
        print("RECORDED", rebuild.recipe_of(ds) is not None)
    """, activation="import")
    assert result.rc == 0, result
    assert "MIXIN 1 3" in result.stdout and "BARE Bare() takes no arguments" in result.stdout
    assert "PICKLE 3 2" in result.stdout and "RECORDED True" in result.stdout
