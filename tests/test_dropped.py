"""DL201: an object that pickles, but without the open file its methods read.

tests/scenarios/multipage_image.py holds a multi-page TIFF open (PIL) and
seeks to one frame per sample. PIL pickles the image as one frame's pixels
and drops the file, so spawn workers (macOS, Windows, Linux from Python
3.14) die with ``'TiffImageFile' object has no attribute '_min_frame'``,
and the probe, which only asks whether it pickles, sees nothing. With the
shim the image is found (``inspection/dropped.py``: the files reachable
before and after the image's own round trip) and opened again, at its frame,
in each worker (``remedies/images.py``); an image that no path opens again
goes to fork on Linux and stops with a clear refusal on a Mac (emulated
workers refuse to copy it, ``remedies/copies.py``). The known-safe batches:
no workers, each sample's worker id the one round robin gives its batch.

The end-to-end tests below need the planner's wiring (rules/pickling_plan.py,
``plan_pickling``); the in-process tests check the pieces directly.
"""

import io
import os
import pickle
import shutil

import pytest

from support import json_log, logged, once_per_run, rotated, run_scenario
from watch_gap import MISSING, acted

Image = pytest.importorskip("PIL.Image")
np = pytest.importorskip("numpy")

from autosafe_torch.errors import NoExactRung  # noqa: E402
from autosafe_torch.inspection import dropped, objwalk  # noqa: E402
from autosafe_torch.remedies import images, reopen  # noqa: E402
from autosafe_torch.remedies.copies import CopyPlan  # noqa: E402

SCENARIO = "multipage_image.py"


def run(tmp_path, start_method, shim=True, platform=None, kind="held", workers=2):
    log = tmp_path / ("log-%s-%s-%s.jsonl" % (start_method, platform, kind))
    env = {"AUTOSAFE_TORCH_LOG_FILE": str(log)} if shim else {}
    if platform:
        env["AUTOSAFE_TORCH_AS"] = platform
    result = run_scenario(tmp_path, SCENARIO, activation="env" if shim else None,
                          start_method=start_method, env=env, args=(kind, str(workers)))
    return result, json_log(log)


def pids(result):
    return int(result.stdout.split("PIDS ")[1].split()[0])


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """``reference(kind)``: the batches of each kind with no workers, the worker ids
    folded in (once in the whole test run, for the kinds the tests compare with)."""

    def batches(kind):
        result, _ = run(tmp_path_factory.mktemp("reference"), "fork", shim=False, kind=kind,
                        workers=0)
        assert result.rc == 0 and result.batches, result
        return result.batches

    return lambda kind: once_per_run(tmp_path_factory, "dropped-reference-" + kind,
                                     lambda: batches(kind))


# -- end to end -------------------------------------------------------------------


@pytest.mark.rule("DL201")
def test_without_the_shim_spawned_workers_lose_the_file(tmp_path):
    plain, records = run(tmp_path, "spawn", shim=False)
    assert plain.rc != 0 and "object has no attribute '_min_frame'" in plain.stderr, plain
    assert records == []


@pytest.mark.rule("DL201")
@pytest.mark.parametrize("start_method, platform", [
    pytest.param("spawn", "macos"),
    pytest.param("spawn", None, marks=pytest.mark.heavy),
    pytest.param("forkserver", None, marks=pytest.mark.heavy)])
def test_the_image_is_opened_again_at_its_frame_in_each_worker(tmp_path, reference,
                                                                start_method, platform):
    shim, records = run(tmp_path, start_method, platform=platform)
    assert shim.rc == 0, shim
    assert shim.batches == reference("held") and pids(shim) == 2  # real worker processes
    (said,) = logged(shim.stderr, "DL201")
    assert "dataset.img" in said.done, said
    (record,) = [r for r in records if r["code"] == "DL201"]
    assert record["action"] == "fixed", record


@pytest.mark.rule("DL201")
@pytest.mark.parametrize("platform", [
    pytest.param("macos"),
    pytest.param(None, marks=pytest.mark.heavy)])
def test_an_image_no_path_opens_again_is_never_sent_as_one_frame(tmp_path, reference,
                                                                 platform):
    shim, records = run(tmp_path, "spawn", platform=platform, kind="deleted")
    if platform == "macos":  # no fork rung: emulated workers, which refuse to copy it
        assert shim.rc != 0 and "NoExactRung" in shim.stderr, shim
        (record,) = [r for r in records if r["code"] == "DL201"]
        assert record["action"] == "failed", record  # never "fixed"
        if MISSING:  # no step down without the watch: the worker's failure, said
            assert "this torch cannot watch its workers" in shim.stderr, shim
            assert "_min_frame" not in shim.stderr
            return
        assert "dataset.img (a TiffImageFile) cannot be copied for each emulated worker" \
            in shim.stderr
        assert "fix: open the image lazily in __getitem__" in shim.stderr
        assert "_min_frame" not in shim.stderr
        return
    assert shim.rc == 0, shim  # Linux: forked workers have the parent's image
    assert shim.batches == reference("held") and pids(shim) == 2
    (record,) = [r for r in records if r["code"] == "DL201"]
    assert "fork" in record["strategy"], record


@pytest.mark.rule("DL201")
@pytest.mark.parametrize("kind, start_method", rotated(("single", "lazy"),
                                                       ("spawn", "forkserver")))
def test_a_healthy_image_dataset_is_left_alone(tmp_path, reference, kind, start_method):
    plain, _ = run(tmp_path, start_method, shim=False, kind=kind)
    assert plain.rc == 0, plain
    shim, records = run(tmp_path, start_method, kind=kind)
    assert shim.rc == 0 and shim.batches == plain.batches, shim
    assert plain.batches == reference("single" if kind == "single" else "held")
    assert records == [] and acted(shim.stderr) == [], shim


# -- in process: what is found ------------------------------------------------------


def frame(k):
    return np.full((4, 6), 10 * k + 1, np.uint8)


@pytest.fixture
def tiff(tmp_path):
    path = str(tmp_path / "frames.tif")
    pages = [Image.fromarray(frame(k)) for k in range(5)]
    pages[0].save(path, save_all=True, append_images=pages[1:])
    return path


@pytest.fixture
def png(tmp_path):
    path = str(tmp_path / "page.png")
    Image.fromarray(frame(3)).save(path)
    return path


class Holder:
    def __init__(self, **kw):
        self.__dict__.update(kw)


class Dropping:
    """Its pickle leaves its file behind, and nothing opens it again."""

    def __init__(self, path):
        self.path, self.fh = path, open(path, "rb")

    def __getstate__(self):
        return dict(self.__dict__, fh=None)

    def __getitem__(self, i):
        self.fh.seek(i)
        return self.fh.read(1)


class LazilyOpened(Dropping):
    def __getitem__(self, i):
        if self.fh is None:
            self.fh = open(self.path, "rb")
        return super().__getitem__(i)


class ReopenedByItsReduce:
    def __init__(self, path):
        self.path, self.fh = path, open(path, "rb")

    def __reduce__(self):
        return ReopenedByItsReduce, (self.path,)


class KeepsItsFile:
    def __init__(self, path):
        self.path, self.fh = path, open(path, "rb")

    def __getstate__(self):
        return dict(self.__dict__)


class Exploding:
    def __init__(self, path):
        self.fh = open(path, "rb")

    def __getstate__(self):
        raise RuntimeError("boom")


class DropsItsImageLazily:
    def __init__(self, path):
        self.path, self.img = path, Image.open(path)

    def __getstate__(self):
        return dict(self.__dict__, img=None)

    def __getitem__(self, i):
        if self.img is None:
            self.img = Image.open(self.path)
        self.img.seek(i)
        return np.asarray(self.img)


@pytest.mark.rule("DL201")
def test_a_multipage_image_is_found_with_its_file_named(tiff):
    dataset = Holder(img=Image.open(tiff), paths=["a"] * 100)
    dataset.img.seek(2)
    np.asarray(dataset.img)  # a loaded frame: PIL keeps the file on _fp alone
    (found,) = dropped.unfaithful({"dataset": dataset, "collate_fn": None})
    assert not found.ok and found.path == "dataset.img" and found.value is dataset.img
    assert found.error == "pickles without its open file frames.tif (PIL's pickle keeps one frame)"
    assert found.fix == dropped.IMAGE_FIX
    assert dropped.reopens(found.value)


@pytest.mark.rule("DL201")
def test_the_planned_reducers_count(tiff, png):
    dataset = Holder(img=Image.open(tiff))
    assert dropped.unfaithful({"dataset": dataset}, images.image_reducers()) == []
    kept = Holder(f=KeepsItsFile(png))
    assert dropped.unfaithful({"dataset": kept}, reopen.file_reducers()) == []


def test_an_object_whose_pickle_keeps_its_file_is_not_found(png):
    assert dropped.unfaithful({"dataset": Holder(r=ReopenedByItsReduce(png))}) == []


def test_a_pickle_that_drops_a_file_is_found_where_it_drops_it(png):
    dataset = Holder(reader=Dropping(png))
    (found,) = dropped.unfaithful({"dataset": dataset})
    assert found.path == "dataset.reader" and found.value is dataset.reader
    assert found.error == "pickles without its open file page.png (its pickle drops .fh)"
    assert found.fix == dropped.FILE_FIX
    assert not dropped.reopens(found.value)


def test_what_opens_its_file_again_itself_is_not_found(png, tiff):
    assert dropped.unfaithful({"dataset": Holder(reader=LazilyOpened(png))}) == []
    assert dropped.unfaithful({"dataset": DropsItsImageLazily(tiff)}) == []


def test_an_image_of_one_frame_travels_as_its_pixels(png):
    img = Image.open(png)
    assert img.fp is not None and dropped.single_frame(img)
    assert dropped.unfaithful({"dataset": Holder(img=img)}) == []
    assert not dropped.reopens(img)


def test_no_open_file_costs_one_walk_and_no_pickle(monkeypatch):
    torch = pytest.importorskip("torch")
    walks = []
    real_walk = objwalk.walk

    def counted(*args, **kwargs):
        walks.append(args[1] if len(args) > 1 else kwargs.get("path"))
        return real_walk(*args, **kwargs)

    def never(*args, **kwargs):
        raise AssertionError("nothing holds a file: nothing to pickle")

    monkeypatch.setattr(objwalk, "walk", counted)
    monkeypatch.setattr(dropped, "reached", never)
    dataset = Holder(x=torch.zeros(100, 100), paths=["p%d" % i for i in range(100_000)])
    assert dropped.unfaithful({"dataset": dataset, "collate_fn": None}) == []
    assert walks == ["dataset"]


def test_an_object_that_cannot_be_looked_at_is_skipped(png, monkeypatch):
    assert dropped.unfaithful({"dataset": Holder(e=Exploding(png))}) == []
    monkeypatch.setattr(dropped._Search, "run", lambda self, parts: 1 / 0)
    assert dropped.unfaithful({"dataset": Holder(r=Dropping(png))}) == []


LOADED = []  # what ran of the program's loading code


class Counted(ReopenedByItsReduce):
    def __init__(self, path):
        LOADED.append("__init__")
        super().__init__(path)


class Restored(Dropping):
    def __setstate__(self, state):
        LOADED.append("__setstate__")
        self.__dict__.update(state)


def test_nothing_is_loaded_here(png, tiff, monkeypatch):
    """No user object is unpickled in the training process only to test it:
    no reducer's loading function runs (no file opened again), and no
    __setstate__ or constructor of the program's runs either."""
    loaded = LOADED

    monkeypatch.setattr(reopen, "_reopen_file", lambda *args: loaded.append(args))
    kept = Holder(f=KeepsItsFile(png), r=Counted(png), d=Restored(png), img=Image.open(tiff))
    loaded.clear()
    found = dropped.unfaithful({"dataset": kept}, reopen.file_reducers())
    assert [f.path for f in found] == ["dataset.d", "dataset.img"]
    assert loaded == [] and not kept.f.fh.closed


# -- in process: the reducer and the copies --------------------------------------------


def pickled(obj):
    """``obj`` pickled with the image reducers, as ForkingPickler pickles it
    with them registered."""
    import copyreg

    class Pickler(pickle.Pickler):
        dispatch_table = {**copyreg.dispatch_table, **images.image_reducers()}

    buffer = io.BytesIO()
    Pickler(buffer, pickle.DEFAULT_PROTOCOL).dump(obj)
    return buffer.getvalue()


def sent(obj):
    """``obj`` as a spawned worker receives it with the image reducers registered."""
    return pickle.loads(pickled(obj))


@pytest.mark.rule("DL201")
def test_the_reducer_opens_the_image_again_at_its_frame(tiff):
    img = Image.open(tiff)
    img.seek(3)
    np.asarray(img)
    there = sent(img)
    assert type(there) is type(img) and there.tell() == 3 and there.filename == tiff
    assert (np.asarray(there) == frame(3)).all()
    there.seek(1)  # what PIL's own pickle cannot do
    assert (np.asarray(there) == frame(1)).all() and img.tell() == 3
    assert there.fp is not img._fp


def test_an_image_opened_from_a_file_object_or_memory_comes_back_so(tiff):
    with open(tiff, "rb") as f:
        img = Image.open(f)
        img.seek(2)
        there = sent(img)
        assert there.filename == "" and there.tell() == 2
        there.seek(4)
        assert (np.asarray(there) == frame(4)).all()
        there._fp.close()
    with open(tiff, "rb") as f:
        in_memory = Image.open(io.BytesIO(f.read()))
    in_memory.seek(1)
    there = sent(in_memory)
    there.seek(4)
    assert (np.asarray(there) == frame(4)).all() and in_memory.tell() == 1


@pytest.mark.rule("DL201")
def test_a_changed_file_fails_loudly_where_the_image_arrives(tiff):
    payload = pickled(Image.open(tiff))
    os.utime(tiff, ns=(1, 1))
    with pytest.raises(images.ImageFileChanged, match="frames.tif changed after the training "
                       "process opened it"):
        pickle.loads(payload)


def test_what_the_reducer_cannot_reopen(tiff, png, tmp_path):
    one = sent(Image.open(png))  # one frame: PIL's own pickle, its pixels
    assert (np.asarray(one) == frame(3)).all() and not hasattr(one, "fp")
    gone = str(tmp_path / "gone.tif")
    shutil.copy(tiff, gone)
    img = Image.open(gone)
    os.unlink(gone)
    assert not dropped.reopens(img)
    with pytest.raises(TypeError, match="TiffImageFile of several frames cannot be sent"):
        sent(img)


@pytest.mark.rule("DL201")
def test_each_emulated_worker_has_the_image_at_its_frame_over_a_file_of_its_own(tiff):
    dataset = Holder(img=Image.open(tiff), n=3)
    dataset.img.seek(2)
    plan = CopyPlan((dataset, None, None), ("dataset", "collate_fn", "worker_init_fn"))
    first, second = plan.copy()[0], plan.copy()[0]
    assert first.img is not dataset.img and first.img.fp is not second.img.fp
    assert first.img.tell() == 2 and (np.asarray(first.img) == frame(2)).all()
    first.img.seek(4)
    assert (np.asarray(first.img) == frame(4)).all()
    assert second.img.tell() == 2 and dataset.img.tell() == 2


@pytest.mark.rule("DL201")
def test_an_emulated_worker_never_copies_what_drops_its_file(tiff, png, tmp_path):
    gone = str(tmp_path / "gone.tif")
    shutil.copy(tiff, gone)
    dataset = Holder(img=Image.open(gone))
    os.unlink(gone)
    plan = CopyPlan((dataset, None, None), ("dataset", "collate_fn", "worker_init_fn"))
    with pytest.raises(NoExactRung) as refused:
        plan.copy()
    assert refused.value.reason == (
        "dataset.img (a TiffImageFile) cannot be copied for each emulated worker: it pickles "
        "without its open file gone.tif (PIL's pickle keeps one frame)")
    assert refused.value.fix == dropped.IMAGE_FIX
    dropping = CopyPlan((Holder(reader=Dropping(png)), None, None),
                        ("dataset", "collate_fn", "worker_init_fn"))
    with pytest.raises(NoExactRung, match=r"dataset.reader \(a Dropping\) cannot be copied"):
        dropping.copy()
    lazy = CopyPlan((Holder(reader=LazilyOpened(png)),), ("dataset",)).copy()[0]
    assert lazy.reader[2] == open(png, "rb").read()[2:3]
