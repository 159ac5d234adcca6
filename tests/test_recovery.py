"""Recovery from failing workers (DL210-DL213, autosafe_torch/recovery).

Each fault of tests/scenarios/recovery/scenario.py runs in a real
subprocess with real workers under fork, spawn and forkserver; the batches
(index, worker id and seed, four random draws, the dataset copy's fetch
count) must be those of an uninterrupted run, the recovery must be in the
JSON log with its code, strategy and rungs. Controls:
the healthy loader gives the same batches with and without the shim and
records nothing; without the shim each fault crashes; the user's own
ValueError is raised as torch raises it, with no recovery.

Slow by nature: about 20 runs, a spawn worker start costs seconds each on
2 busy cores, and the hang scenario waits twice for the watchdog (10 s here,
AUTOSAFE_TORCH_HANG_TIMEOUT: far above a batch's time on a loaded 2-core machine,
which would otherwise read as a hang). No test asserts on wall time (that is for
benchmarks/): a run that does not end is stopped by RUN_TIMEOUT_S and fails.
"""

import re
import resource
import subprocess
import sys

import pytest

from autosafe_torch import config, report
from autosafe_torch.inspection import failures
from autosafe_torch.rules import ladder, recovery
from autosafe_torch.rung import Rung
from support import (PLATFORM_SIM, SCENARIOS, START_METHODS, Result, assert_readable,
                     clean_env, json_log, line_of, logged, once_per_run, one_of, run_command,
                     shim_lines)
from test_resources import needs_private_shm

SCENARIO = SCENARIOS / "recovery" / "scenario.py"
RUN_TIMEOUT_S = 120  # per run, recovery included: a run still going then has hung
NO_PREDICTION = "DL303,DL304"  # the predicting rules stand aside: recovery is under test


def run(tmp_path, fault, start_method="fork", shim=True, env=None, shm=None, nofile=None):
    """(Result, records from the JSON log)."""
    log = tmp_path / ("log-%s-%s.jsonl" % (fault, start_method))
    extra = {"SCENARIO_TMP": str(tmp_path), "AUTOSAFE_TEST_START_METHOD": start_method,
             "PYTHONPATH": str(PLATFORM_SIM)}
    if shim:
        extra.update(AUTOSAFE_TORCH="1", AUTOSAFE_TORCH_LOG_FILE=str(log),
                     AUTOSAFE_TORCH_DISABLE=NO_PREDICTION)
    extra.update(env or {})
    cmd = [sys.executable, str(SCENARIO), fault]
    if shm:
        cmd = ["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=%s tmpfs /dev/shm && "
               "exec %s %s %s" % (shm, sys.executable, SCENARIO, fault)]

    def lower_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    if shm or nofile:  # a start of its own: a mount namespace, a lower limit
        proc = subprocess.run(cmd, cwd=str(tmp_path), env=clean_env(extra),
                              capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
                              preexec_fn=lower_limit if nofile else None)
    else:
        proc = run_command(cmd, tmp_path, clean_env(extra), RUN_TIMEOUT_S)
    assert_readable(proc.stderr, extra)
    records = json_log(log)
    return Result(proc), records


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """``reference(dataset)``: BATCHES of an uninterrupted run without the shim
    (fork) of that dataset ("none", "shm", "fds"), run once in the whole test run
    and only for the datasets the tests compare with."""

    def batches(fault):
        result, _ = run(tmp_path_factory.mktemp("reference"), fault, shim=False)
        assert result.rc == 0 and result.batches, result
        return result.batches

    return lambda fault: once_per_run(tmp_path_factory, "recovery-reference-" + fault,
                                      lambda: batches(fault))


def recovered(result, records, code, strategies):
    assert result.rc == 0, result
    mine = [r for r in records if r["code"].startswith("DL21")]
    assert [r["code"] for r in mine] == [code], records
    record = mine[0]
    assert record["action"] == "fixed" and record["strategy"] in {r.value for r in strategies}, \
        record
    assert record["before"]["rung"] == Rung.AS_ASKED
    assert record["after"] == {"rung": record["strategy"]}
    assert "resumed at batch %d" % record["before"]["batch"] in record["why"], record
    return record


# -- controls -----------------------------------------------------------------


@pytest.mark.parametrize("start_method", one_of(START_METHODS, 'fork'))
def test_healthy_loader_same_batches_nothing_recorded(tmp_path, reference, start_method):
    result, records = run(tmp_path, "none", start_method)
    assert result.rc == 0, result
    assert result.batches == reference("none")
    assert records == [] and "autosafe_torch" not in result.stderr


def test_without_the_shim_each_fault_crashes(tmp_path):
    for fault in ("kill", "segv"):
        result, _ = run(tmp_path, fault, shim=False)
        # torch 2.0 may report a segfault by the worker's own line alone (its
        # main process then fails in the profiler's exit, not in the loader)
        assert result.rc != 0 and any(words in result.output for words in (
            "DataLoader worker", "ConnectionResetError", "EOFError",
            "segmentation fault encountered in worker")), result


# -- faults, under every start method ---------------------------------------------


@pytest.mark.rule("DL210")
@pytest.mark.parametrize("start_method", one_of(START_METHODS, 'spawn'))
def test_worker_killed_mid_epoch(tmp_path, reference, start_method):
    result, records = run(tmp_path, "kill", start_method)
    record = recovered(result, records, "DL210", {Rung.RESTART})
    assert result.batches == reference("none")
    assert record["before"]["worker"] == 1 and "SIGKILL" in record["before"]["status"]
    assert "no traceback" in record["why"] and "out-of-memory" in record["why"]


@pytest.mark.parametrize("start_method", one_of(START_METHODS, 'forkserver'))
def test_worker_segfaults_on_one_index(tmp_path, reference, start_method):
    """Every worker process crashes on index 13: the restart fails the same
    way, the rung is not tried a third time, emulated workers finish."""
    result, records = run(tmp_path, "segv", start_method)
    record = recovered(result, records, "DL210", {Rung.EMULATED})
    assert result.batches == reference("none")
    assert "SIGSEGV" in record["before"]["status"]
    assert record["why"].count("restart workers failed too") == 1
    # the worker's own Python traceback, no longer lost
    assert "Fatal Python error: Segmentation fault" in record["why"]
    assert re.search(r"scenario\.py:\d+ in __getitem__", record["why"]), record["why"]


def test_worker_that_dies_while_starting_is_named_by_its_own_exception(tmp_path, reference):
    """Plain spawn (no warm server): every worker raises while importing the main
    module. Without the shim torch says only that a worker exited; with it the
    record names the worker's own exception and line, no restart is tried (it
    would die the same way), and emulated workers give the uninterrupted batches."""
    plain, _ = run(tmp_path, "startup", "spawn", shim=False)
    assert plain.rc != 0 and "exited unexpectedly" in plain.stderr, plain
    result, records = run(tmp_path, "startup", "spawn",
                                   env={"AUTOSAFE_TORCH_DISABLE": NO_PREDICTION + ",DL209"})
    record = recovered(result, records, "DL210", {Rung.EMULATED})
    assert result.batches == reference("none")
    assert "restart workers failed" not in record["why"], record
    assert record["before"]["status"] == "exited with code 1" and record["before"]["batch"] == 0
    assert record["fix"] == recovery.STARTING_FIX
    # What the user reads on stderr, whatever the checkout's path: the worker's own
    # exception and the line that raised it (the file by name: the traceback above
    # has its path).
    (line,) = [r.done for r in logged(result.stderr, "DL210")]
    raised = "%s:%d" % (SCENARIO.name, line_of(SCENARIO.parent, "raise ImportError(",
                                               SCENARIO.name))
    assert "ImportError: libscenario.so: cannot open shared object file" in line, line
    assert raised in line and raised in record["why"], (raised, line)


@pytest.mark.rule("DL211")
@pytest.mark.parametrize("start_method", one_of(START_METHODS, 'fork'))
def test_worker_hangs_forever_on_one_index(tmp_path, reference, start_method):
    result, records = run(tmp_path, "hang", start_method,
                                   env={"AUTOSAFE_TORCH_HANG_TIMEOUT": "10"})
    record = recovered(result, records, "DL211", {Rung.EMULATED})
    assert result.batches == reference("none")
    assert record["before"]["status"] == "hung"
    # every worker's stack, the hung one in the user's __getitem__
    assert "every worker's stacks" in record["why"]
    assert "worker 0 (pid" in record["why"] and "worker 1 (pid" in record["why"]
    assert re.search(r'scenario\.py", line \d+ in __getitem__', record["why"])


@pytest.mark.rule("DL214")
@needs_private_shm
@pytest.mark.parametrize("start_method", one_of(START_METHODS, 'spawn'))
def test_dev_shm_exhausted(tmp_path, reference, start_method):
    result, records = run(tmp_path, "shm", start_method, shm="3m")
    record = recovered(result, records, "DL214", {Rung.FEWER, Rung.EMULATED})
    assert result.batches == reference("shm")
    assert "unable to allocate shared memory" in record["why"] \
        or "SIGBUS" in record["before"]["status"], record


@needs_private_shm
def test_dev_shm_exhausted_without_the_shim(tmp_path):
    result, _ = run(tmp_path, "shm", shim=False, shm="3m")
    assert result.rc != 0 and ("unable to allocate shared memory" in result.output
                               or "Bus error" in result.output), result


@pytest.mark.rule("DL213")
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="file_descriptor sharing")
@pytest.mark.parametrize("start_method", one_of(START_METHODS, 'forkserver'))
def test_open_file_limit_exhausted(tmp_path, reference, start_method):
    result, records = run(tmp_path, "fds", start_method, nofile=160)
    recovered(result, records, "DL213", {Rung.FILE_SYSTEM, Rung.EMULATED})
    assert result.batches == reference("fds")
    without, _ = run(tmp_path, "fds", start_method, shim=False, nofile=160) \
        if start_method == "fork" else (None, None)
    if without is not None:
        assert without.rc != 0 and "Too many open files" in without.output, without


@pytest.mark.rule("DL215")
@pytest.mark.parametrize("start_method", one_of(START_METHODS, 'forkserver'))
def test_memory_error_once_is_recovered_with_fewer_batches_in_flight(tmp_path, reference,
                                                                     start_method):
    """A worker's MemoryError (memory pressure from workers x prefetch) ends a
    plain run; once, the shim resumes with prefetch_factor=1 and exact replay."""
    if start_method == "fork":
        without, _ = run(tmp_path, "memory", shim=False)
        assert without.rc != 0 and "MemoryError: Caught MemoryError" in without.stderr, without
    result, records = run(tmp_path, "memory", start_method)
    record = recovered(result, records, "DL215", {Rung.FEWER})
    assert result.batches == reference("none")
    assert "Unable to allocate 1.00 GiB" in record["before"]["status"], record


def test_memory_error_again_is_torch_s_error(tmp_path):
    """Raised again with fewer batches in flight, it is the program's own:
    torch's error reaches the user, and nothing is recorded as fixed."""
    result, records = run(tmp_path, "memory-always")
    assert result.rc != 0, result
    assert "MemoryError: Caught MemoryError in DataLoader worker process" in result.stderr
    assert [r for r in records if r["code"].startswith("DL21")] == []


@pytest.mark.parametrize("start_method", one_of(START_METHODS, 'fork'))
def test_the_users_own_error_is_raised_as_torch_raises_it(tmp_path, start_method):
    result, records = run(tmp_path, "valueerror", start_method)
    assert result.rc != 0, result
    assert [r for r in records if r["code"].startswith("DL21")] == []
    assert "ValueError: bad sample 13" in result.stderr
    assert "Caught ValueError in DataLoader worker process" in result.stderr
    assert 'raise ValueError("bad sample %d" % i)' in result.stderr  # the real traceback
    assert shim_lines(result.stderr) == []  # no recovery, no log line


# -- the pieces, in process ----------------------------------------------------------


def test_ladder_is_bounded():
    """A rung that failed twice is not tried again; None when all have."""
    assert ladder.next_rung("died", {}) == Rung.RESTART
    assert ladder.next_rung("died", {Rung.RESTART: 1}) == Rung.RESTART
    assert ladder.next_rung("died", {Rung.RESTART: 2}) == Rung.EMULATED
    assert ladder.next_rung("died", {Rung.RESTART: 2, Rung.EMULATED: 2}) is None
    assert ladder.next_rung("shm", {}) == Rung.FEWER
    assert ladder.next_rung("fds", {Rung.FILE_SYSTEM: 2}) == Rung.EMULATED
    # Memory: once, with fewer batches in flight; a repair a worker could not
    # apply: emulated workers at once (new workers would fail alike).
    assert ladder.next_rung("memory", {Rung.RESTART: 1}) == Rung.FEWER
    assert ladder.next_rung("memory", {Rung.RESTART: 1, Rung.FEWER: 1}) is None
    assert ladder.next_rung("remedy", {Rung.RESTART: 1}) == Rung.EMULATED
    for rungs in ladder.LADDERS.values():  # fewer workers would change the batches
        assert "fewer workers" not in " ".join(rungs)


def test_failures_are_told_apart():
    assert failures.exception_kind(RuntimeError("received 0 items of ancdata")) == "fds"
    assert failures.exception_kind(OSError(24, "Too many open files")) == "fds"
    assert failures.exception_kind(RuntimeError(
        "Caught RuntimeError in DataLoader worker process 0.\nOriginal Traceback ...\n"
        "RuntimeError: unable to allocate shared memory(shm) for file </torch_1>")) == "shm"
    assert failures.exception_kind(ValueError("bad sample 13")) is None
    assert failures.exception_kind(MemoryError("Caught MemoryError in DataLoader")) == "memory"
    assert failures.exception_kind(OSError(12, "Cannot allocate memory")) == "memory"
    assert failures.exception_kind(failures.RemedyFailed("fd 3")) == "remedy"
    assert failures.death_kind(-7) == "shm" and failures.death_kind(-9) == "died"
    assert failures.exit_status(-9).startswith("killed by signal SIGKILL")
    assert failures.exit_status(1) == "exited with code 1"


def test_dump_where_and_trim_dump():
    dump = ('Fatal Python error: Segmentation fault\n\nCurrent thread 0x1 (most recent call '
            'first):\n  File "%s/ctypes/__init__.py", line 519 in string_at\n'
            '  File "/home/u/ds.py", line 61 in __getitem__\n'
            '  File "/usr/lib/python3/multiprocessing/process.py", line 314 in _bootstrap\n'
            '  File "/home/u/train.py", line 9 in main\n\nExtension modules: numpy\n') % (
        __import__("sysconfig").get_paths()["stdlib"])
    assert failures.where(dump) == "/home/u/ds.py:61 in __getitem__"
    trimmed = failures.trim_dump(dump)
    assert "train.py" not in trimmed and "Extension modules" not in trimmed
    assert "ds.py" in trimmed


def test_hang_timeout_is_validated_with_one_warning(capsys):
    name = config.ENV_HANG_TIMEOUT
    assert config.parse_seconds(name, None, 60.0) == 60.0
    assert config.parse_seconds(name, "2.5", 60.0) == 2.5
    assert config.parse_seconds(name, "off", 60.0) == 0.0
    assert capsys.readouterr().err == ""
    assert config.parse_seconds(name, "soon", 60.0) == 60.0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and name in err and "using 60" in err
    assert config.Config.from_env({name: "-3"}).hang_timeout == 60.0


def test_watchdog_limit_from_observed_batch_times():
    from autosafe_torch.recovery.watch import STARTUP_MIN_S, Watch

    watch = Watch(frozenset({"hung"}), 5.0, 0)
    assert watch.limit() == STARTUP_MIN_S  # workers starting
    watch.observed(4.0)  # the start: not a batch time
    assert watch.limit() == 5.0
    watch.observed(1.5)
    assert watch.limit() == 15.0  # 10x the slowest wait
    assert Watch(frozenset({"hung"}), 5.0, 120).limit() >= 120  # never below timeout
    assert Watch(frozenset({"died"}), 5.0, 7).limit() == 7  # no watchdog: torch's timeout
    assert Watch(frozenset({"died"}), 5.0, 0).limit() is None


def test_not_watched_in_warn_mode_or_disabled():
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    import autosafe_torch
    from autosafe_torch.recovery import RecoveringIter

    loader = DataLoader(TensorDataset(torch.arange(8.0)), batch_size=2, num_workers=1,
                        multiprocessing_context="fork")
    was = config.CONFIG.mode
    try:
        autosafe_torch.activate("test")
        it = iter(loader)
        assert isinstance(it, RecoveringIter) and [b[0].tolist() for b in it][0] == [0, 1]
        config.CONFIG.mode = "warn"
        assert not isinstance(iter(loader), RecoveringIter)
        config.CONFIG.mode = was
        config.CONFIG.disabled = frozenset(recovery.KINDS)
        assert not isinstance(iter(loader), RecoveringIter)
    finally:
        config.CONFIG.mode = was
    assert report.interventions() == []


def test_the_users_own_timeout_is_torch_s_error(tmp_path):
    """A loader with timeout=1 whose batch is not ready in time: torch's own
    "DataLoader timed out after 1 seconds", as without the shim, and no
    recovery (the user chose to give up; PyTorch's test_timeout). The workers
    wait for the parent to have given up before they return (a minute at
    most): no race between a sleep and the timeout, and no worker left busy
    at exit."""
    from support import run_script

    body = """
import os, time, torch
from torch.utils.data import DataLoader, Dataset
class Blocked(Dataset):
    def __init__(self):
        self.given_up = os.path.abspath("given-up-%d" % os.getpid())  # one per run
    def __len__(self):
        return 4
    def __getitem__(self, i):
        for _ in range(6000):
            if os.path.exists(self.given_up):
                break
            time.sleep(0.01)
        return i
if __name__ == "__main__":
    dataset = Blocked()
    try:
        next(iter(DataLoader(dataset, batch_size=2, num_workers=2, timeout=1)))
    except RuntimeError as exc:
        open(dataset.given_up, "w").close()
        print("ERROR", exc)
"""
    plain = run_script(tmp_path, body, start_method="fork")
    log = tmp_path / "log.jsonl"
    shimmed = run_script(tmp_path, body, start_method="fork", activation="env",
                         env={"AUTOSAFE_TORCH_LOG_FILE": str(log)})
    assert "ERROR DataLoader timed out after 1 seconds" in plain.stdout, plain
    assert shimmed.stdout == plain.stdout and not log.exists(), shimmed
