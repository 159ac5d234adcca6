"""Isolation at the kernel (issue 26): every descriptor a worker holds,
whoever holds it; a record says "fixed" only once the fix held.

The scenario (tests/scenarios/kernel_holders.py) holds a file opened in
``__init__`` where no object walk looks: a raw ``os.open()`` descriptor, a
file opened ``'r+b'``, a ``NamedTemporaryFile``, a ``functools.partial``, a
closure, a weak proxy into a module-level pool, a ``csv.reader`` and
libsndfile's own descriptor. Its safe twin opens the file in the process
that reads it. Each holder on each rung: fork (Linux), forkserver (Linux,
Python 3.14), spawn as on Linux (a fork rung exists), spawn as on macOS
(none), and emulated workers themselves. Without the shim: an error or
other batches than the twin's. With it: the twin's batches, or a clear
error (``NoExactRung``) where no rung can be exact, and then no record
says "fixed".
"""


import pytest

from support import json_log, once_per_run, rotated, run_scenario

KINDS = ("rawfd", "rplus", "tempfile", "partial", "closure", "weakproxy", "csv", "soundfile")
RUNGS = ("fork", "forkserver", "spawn", "macos", "emulated")
# How each rung is reached: the start method forced from outside, the platform rehearsed.
SETUP = {"fork": ("fork", None), "forkserver": (None, "linux-py314"), "spawn": ("spawn", None),
         "macos": (None, "macos"), "emulated": ("fork", None)}
# Neither pickles nor copies: on emulated workers, a clear error, never two
# workers sharing one reader. On macOS (no fork rung) the dataset is built again
# in each worker from its constructor's arguments (DL201), real workers.
NO_COPY = ("weakproxy", "csv", "soundfile")
# Their constructors open files for writing ('r+b', a temporary file written):
# a worker refuses to build them again (issue 40), so on macOS the rebuild fails
# in the worker, loudly, and the recovery resumes on emulated workers.
WRITERS = ("rplus", "tempfile")

def twin(tmp_path_factory, kind):
    """The safe twin's batches (fork, no shim): the known-safe run (once in the
    whole test run)."""

    def batches():
        tmp = tmp_path_factory.mktemp("twin")
        result = run_scenario(tmp, "kernel_holders.py", args=(kind, "twin"), start_method="fork")
        assert result.rc == 0 and result.batches, result
        return result.batches

    return once_per_run(tmp_path_factory, "kernel-holders-twin-" + kind, batches)


def refused(kind, rung):
    return kind in NO_COPY and rung == "emulated"


def plain_run(tmp_path, kind, rung):
    method, platform = SETUP[rung]
    env = {"AUTOSAFE_TORCH_AS": platform} if platform else {}
    return run_scenario(tmp_path, "kernel_holders.py", args=(kind, "held"),
                        start_method=method, env=dict(env, AUTOSAFE_TORCH="0"))


def shim_run(tmp_path, kind, rung, name="log"):
    """(Result, records) of the held dataset with the shim on ``rung``; the
    emulated rung is run by the scenario itself (``EmulatedWorkersIter``)."""
    method, platform = SETUP[rung]
    if rung == "emulated":
        result = run_scenario(tmp_path, "kernel_holders.py", args=(kind, "emulated"),
                              start_method=method, env={"AUTOSAFE_TORCH": "0"})
        return result, []
    log = tmp_path / ("%s.jsonl" % name)
    env = {"AUTOSAFE_TORCH_LOG_FILE": str(log)}
    if platform:
        env["AUTOSAFE_TORCH_AS"] = platform
    result = run_scenario(tmp_path, "kernel_holders.py", args=(kind, "held"), activation="env",
                          start_method=method, env=env)
    records = json_log(log)
    return result, records


@pytest.mark.rule("DL217")
@pytest.mark.parametrize("kind, rung", rotated(KINDS, RUNGS))
def test_every_holder_on_every_rung(tmp_path, tmp_path_factory, kind, rung):
    safe = twin(tmp_path_factory, kind)
    if rung != "emulated":
        plain = plain_run(tmp_path, kind, rung)
        for _ in range(2 if rung == "fork" else 0):  # a race: three tries to show it
            if plain.rc != 0 or plain.batches != safe:
                break
            plain = plain_run(tmp_path, kind, rung)
        assert plain.rc != 0 or plain.batches != safe, plain
    result, records = shim_run(tmp_path, kind, rung)
    assert "internal error" not in result.stderr, result
    if refused(kind, rung):
        assert result.rc != 0 and "NoExactRung" in result.stderr, result
        assert "neither pickles for spawn workers nor copies for emulated ones" \
            in result.stderr, result
        assert "no rung gives the batches of its workers exactly" in result.stderr
        assert not result.batches, result
        assert all(r["action"] != "fixed" for r in records), records
        assert rung == "emulated" or any(r["action"] == "failed" for r in records), records
        return
    assert result.rc == 0 and result.batches == safe, result
    if rung == "emulated":
        return
    codes = {r["code"] for r in records}
    if kind in WRITERS and rung == "macos":
        rebuilt = [r for r in records if r["code"] == "DL201"]
        assert rebuilt and all(r["action"] == "failed" for r in rebuilt), records
        assert all("its constructor writes files" in r["done"] for r in rebuilt), records
        assert [r["action"] for r in records if r["code"] == "DL216"] == ["fixed"], records
        return
    assert all(r["action"] == "fixed" for r in records), records
    if kind == "rawfd" and rung != "fork":  # the descriptor travels by its number
        assert "DL217" in codes, records
    else:
        assert codes & {"DL201", "DL207", "DL209"} or rung == "macos", records


@pytest.mark.heavy
@pytest.mark.parametrize("kind", KINDS)
def test_fork_cases_five_times(tmp_path, tmp_path_factory, kind):
    """Races are not deterministic: five shimmed fork runs, each exact."""
    safe = twin(tmp_path_factory, kind)
    for attempt in range(5):
        result, records = shim_run(tmp_path, kind, "fork", name="log%d" % attempt)
        assert result.rc == 0 and result.batches == safe, result
        assert {r["code"] for r in records} == {"DL207"}, records


APPENDED_LOG = """
import os, torch
from torch.utils.data import DataLoader, Dataset

class Logged(Dataset):
    def __init__(self, mode):
        with open("data.bin", "wb") as f:
            f.write(bytes(range(256)) * 64)
        self.path = os.path.abspath("data.bin")
        self.data = None
        self.log = open("fetches.log", mode)  # held from __init__, written by every worker
    def __len__(self):
        return 32
    def __getitem__(self, i):
        if self.data is None:  # the data file: opened in the process that reads it
            self.data = open(self.path, "rb")
        self.data.seek(i * 100)
        self.log.write("%d %d\\n" % (i, os.getpid()))
        self.log.flush()
        return torch.tensor(list(self.data.read(4))) + torch.rand(1)

if __name__ == "__main__":
    import sys
    torch.manual_seed(0)
    digest(DataLoader(Logged(sys.argv[1]), batch_size=4, num_workers=2))
"""


@pytest.mark.parametrize("mode", ["a", "a+"])
def test_a_log_the_workers_append_to_keeps_every_line(tmp_path, mode):
    """Healthy control: a log opened for appending in __init__ (write-only,
    or readable with ``a+``) that forked workers write to. Every line
    arrives, with and without the shim, the batches are the same, and
    nothing is recorded."""
    from support import run_script

    plain_dir, shim_dir = tmp_path / "plain", tmp_path / "shim"
    plain_dir.mkdir()
    shim_dir.mkdir()
    plain = run_script(plain_dir, APPENDED_LOG, start_method="fork", args=[mode])
    log = shim_dir / "log.jsonl"
    shim = run_script(shim_dir, APPENDED_LOG, start_method="fork", args=[mode],
                      activation="env", env={"AUTOSAFE_TORCH_LOG_FILE": str(log)})
    assert plain.rc == 0 and shim.rc == 0, (plain, shim)
    assert shim.batches == plain.batches
    for where in (plain_dir, shim_dir):
        lines = (where / "fetches.log").read_text().splitlines()
        assert sorted(int(line.split()[0]) for line in lines) == list(range(32)), where
    assert not log.exists(), log.read_text()


STR_RAISES = """
import torch
from torch.utils.data import DataLoader, Dataset

MESSAGES = {1: "end of file"}

class CodedError(RuntimeError):
    # As soundfile.LibsndfileError: built from an error code, which str() looks
    # up. torch re-raises a worker's exception as CodedError(its message), and
    # then str() raises TypeError.
    def __init__(self, code):
        super().__init__(code)
        self.code = code
    def __str__(self):
        return MESSAGES[self.code]

class Fails(Dataset):
    def __len__(self):
        return 8
    def __getitem__(self, i):
        if i == 5:
            raise CodedError(1)
        return torch.tensor([i])

if __name__ == "__main__":
    try:
        for batch in DataLoader(Fails(), batch_size=2, num_workers=2):
            pass
    except Exception as exc:
        print("RAISED", type(exc).__name__, flush=True)
"""


def test_an_error_whose_str_raises_reaches_the_user_as_it_is(tmp_path):
    """Inspection never replaces the user's error: an exception whose
    ``str()`` raises is described by its type, and the user's own error is
    the one raised, with and without the shim."""
    from support import run_script

    plain = run_script(tmp_path, STR_RAISES, start_method="fork")
    shim = run_script(tmp_path, STR_RAISES, start_method="fork", activation="env")
    assert "RAISED CodedError" in plain.stdout, plain
    assert "RAISED CodedError" in shim.stdout, shim
    assert "internal error" not in shim.stderr, shim
