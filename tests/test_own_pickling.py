"""The program's own pickling is as it would be without us.

Our repairs are reducers. Registered with multiprocessing's ForkingPickler,
which is the whole process's (the program's own ``Queue.put``, ``Pipe.send``
and ``Pool.map`` pickle with it too), a repaired loader left them there for
every pickle: a program that put an open file or a lambda on its own queue
got it through with the shim, and an error without it (promise 1: the shim
acts only on the loader it repairs). Now they live in a pickler of our own,
``WorkerPickler``, which pickles only what our workers are sent; the
ForkingPickler is never touched.
"""

import pickle
from multiprocessing.reduction import ForkingPickler

import pytest

from autosafe_torch.mp_private import extra_reducers
from autosafe_torch.remedies import byvalue, pickling, reopen
from support import logged, run_script

# The dataset reads its held file with os.pread: forked workers share one file
# offset, and a seek then a read would race between them (a shorter line now
# and then: CI saw the fork run's batches differ so, not the shim's).
SCRIPT = """
import os
from multiprocessing.reduction import ForkingPickler

import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info


class Lines(Dataset):
    def __init__(self, path, transform):
        self.fh = open(path)  # held open: spawn cannot send it as it is
        self.lines = self.fh.read().splitlines()
        self.transform = transform

    def __len__(self):
        return len(self.lines)

    def __getitem__(self, i):
        first = os.pread(self.fh.fileno(), 64, 0).split(b"\\n")[0]
        info = get_worker_info()
        return self.transform(torch.tensor([float(len(first)), float(i),
                                            torch.rand(1).item(),
                                            float(info.id if info else -1)]))


def own_pickling(label, obj):
    try:
        ForkingPickler.dumps(obj)
        print(label, "pickled")
    except Exception as exc:
        print(label, "refused", type(exc).__name__)


if __name__ == "__main__":
    with open("lines.txt", "w") as f:
        f.write("\\n".join("x" * n for n in range(1, 17)))
    torch.manual_seed(0)
    loader = DataLoader(Lines("lines.txt", lambda t: t * 2), batch_size=4, num_workers=2,
                        shuffle=True)
    digest(loader)
    with open("lines.txt") as held:
        own_pickling("an open file", held)
    own_pickling("a lambda", lambda x: x)
"""


def own_lines(stdout):
    return [line for line in stdout.splitlines() if not line.startswith("BATCHES")]


def test_a_programs_own_pickling_after_a_repaired_loader_is_as_without_the_shim(tmp_path):
    for name in ("plain", "shim"):
        (tmp_path / name).mkdir()
    plain = run_script(tmp_path / "plain", SCRIPT, start_method="fork")
    assert plain.rc == 0, plain
    assert own_lines(plain.stdout) == ["an open file refused TypeError",
                                       "a lambda refused PicklingError"]
    shim = run_script(tmp_path / "shim", SCRIPT, activation="env", start_method="spawn")
    assert shim.rc == 0, shim
    assert shim.batches == plain.batches  # the loader repaired: fork's batches
    assert logged(shim.stderr, "DL202"), shim.stderr  # the lambda went by value
    assert own_lines(shim.stdout) == own_lines(plain.stdout)


def test_our_reducers_act_only_in_our_workers_pickler(tmp_path):
    before = dict(extra_reducers())
    reopen.install_reducers()
    byvalue.send_by_value_where_needed()
    try:
        assert extra_reducers() == before  # the process's table: untouched
        assert "reducer_override" not in vars(ForkingPickler)
        path = tmp_path / "data.txt"
        path.write_text("abc\ndef\n")
        with open(path) as held:
            held.readline()
            with pytest.raises(TypeError, match="cannot pickle '_io.TextIOWrapper'"):
                ForkingPickler.dumps(held)
            with pytest.raises((pickle.PicklingError, AttributeError)):  # as the Python says
                ForkingPickler.dumps(lambda x: x + 1)
            again = pickle.loads(pickling.WorkerPickler.dumps(held))
            add = pickle.loads(pickling.WorkerPickler.dumps(lambda x: x + 1))
            assert again.name == held.name and again.readline() == "def\n"
            assert add(1) == 2
    finally:
        pickling.uninstall_reducers()


def test_a_reducer_the_program_registered_answers_outside_our_start(tmp_path):
    import io

    mine = []

    def program_reducer(f):
        mine.append(f)
        return str, ("the program's",)

    ForkingPickler.register(io.TextIOWrapper, program_reducer)
    try:
        reopen.install_reducers()
        (tmp_path / "x.txt").write_text("x\n")
        with open(tmp_path / "x.txt") as held:
            assert pickle.loads(ForkingPickler.dumps(held)) == "the program's"
            assert mine == [held]
            assert pickle.loads(pickling.WorkerPickler.dumps(held)).name == held.name
            assert len(mine) == 1
            assert extra_reducers()[io.TextIOWrapper] is program_reducer
    finally:
        pickling.uninstall_reducers()
        extra_reducers().pop(io.TextIOWrapper, None)


ONE_PICKLE = """
import multiprocessing
import sys
from multiprocessing.reduction import ForkingPickler

from autosafe_torch.remedies import pickling, reopen


def child_reads(held, out):
    with open(out, "w") as f:
        f.write(held.readline())


if __name__ == "__main__":
    made = []
    init = ForkingPickler.__init__

    def counting(self, *args, **kwargs):
        made.append(type(self).__name__)
        init(self, *args, **kwargs)

    ForkingPickler.__init__ = counting
    reopen.install_reducers()
    method = sys.argv[1]
    context = pickling.WorkerContext(multiprocessing.get_context(method), method)
    with open("data.txt") as held:
        held.readline()
        process = context.Process(target=child_reads, args=(held, "out.txt"))
        print(type(process).__name__, process.name)
        process.start()
        process.join(60)
    with open("out.txt") as f:
        print(process.exitcode, f.read().strip(), " ".join(made))
"""


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_worker_goes_in_one_pickle_of_ours(tmp_path, method):
    """A worker's start pickles its process once, with WorkerPickler, in the
    Popen's own dump: nothing nested (a pickle inside the pickle held a second
    copy of the dataset's bytes in the parent while each worker started:
    1.084x its peak memory at 1.28M samples, figure 19c), and the process is
    the stdlib's, as without us."""
    (tmp_path / "data.txt").write_text("abc\ndef\n")
    proc = run_script(tmp_path, ONE_PICKLE, args=(method,), name="one_pickle.py")
    assert proc.rc == 0, proc.stderr
    kind = {"spawn": "SpawnProcess", "forkserver": "ForkServerProcess"}[method]
    assert proc.stdout.split("\n")[:2] == [
        "%s %s-1" % (kind, kind),
        "0 def WorkerPickler WorkerPickler",  # the preparation data, then the process
    ], proc.stdout
