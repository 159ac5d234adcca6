"""DL209: repaired spawn loaders start their workers warm, with spawn's batches.

Real subprocesses (tests/scenarios/warmstart/loader.py), the start method
forced from outside. The reference for a repaired loader is plain spawn:
the same repair with DL209 disabled, and the hand-safe dataset without
autosafe_torch. Everything a worker can observe goes into the digest: the
per-worker seeds of torch, ``random`` and numpy, ``get_worker_info()``, a
fresh dataset copy per worker and epoch (its fetch count), the worker's
process name and modules; the main module's top-level code must run as
often as under spawn (imports.log).
"""

import os
import time

import pytest

from support import json_log, logged, result_once_per_run, run_scenario

SCENARIO = "warmstart/loader.py"


def run(tmp_path, kind, *, shim=True, start="spawn", env=None, args=()):
    for name in ("imports.log",):
        if (tmp_path / name).exists():
            (tmp_path / name).unlink()
    extra = dict(env or {})
    log = tmp_path / ("log-%d.jsonl" % len(list(tmp_path.glob("log-*.jsonl"))))
    if shim:
        extra["AUTOSAFE_TORCH_LOG_FILE"] = str(log)
    res = run_scenario(tmp_path, SCENARIO, activation="env" if shim else None,
                       start_method=start, env=extra, args=(kind,) + tuple(args))
    res.imports = len((tmp_path / "imports.log").read_text().splitlines()) \
        if (tmp_path / "imports.log").exists() else 0
    res.records = json_log(log) if shim else []
    return res


def start_is_a_clause(res, strategy, action="fixed"):
    """DL209, the workers' start (``strategy``, ``action``), goes with DL201's repair
    (fixed) in the JSON log; on stderr a clause of DL201's line, not a line of its own."""
    codes = {r["code"]: r for r in res.records}
    assert codes["DL201"]["action"] == "fixed", res.records
    assert (codes["DL209"]["strategy"], codes["DL209"]["action"]) == (strategy, action), \
        res.records
    (line,) = logged(res.stderr, "DL201")
    assert logged(res.stderr, "DL209") == [] and codes["DL209"]["done"] in line.done, line


def started_by(res):
    return [line.split()[1:] for line in res.stdout.splitlines()
            if line.startswith("STARTED_BY")][-1]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The hand-safe dataset under plain spawn, without autosafe_torch (once in the
    whole test run)."""
    res = result_once_per_run(tmp_path_factory, "warmstart-reference", lambda: run(
        tmp_path_factory.mktemp("ref"), "healthy", shim=False))
    assert res.rc == 0 and res.batches, res
    assert started_by(res) == ["parent"], res
    assert res.imports == 5, res  # this process + 2 workers x 2 epochs
    return res


def test_the_server_starts_ahead_for_a_repaired_loader_only(tmp_path, reference):
    """Built a loader the ladder will repair for spawn, the warm server starts at
    once, in a thread of its own (the main thread goes on with the program's
    setup), and runs before the first iterator, with the batches of spawn. (A
    healthy spawn loader starts nothing: test_a_healthy_spawn_loader_is_left_alone.)"""
    warm = run(tmp_path, "legacy", args=("--ahead",))
    assert warm.rc == 0 and "AHEAD True True" in warm.stdout, warm
    assert warm.batches == reference.batches and started_by(warm) == ["server"], warm
    # A forwarder pickles, so the probe finds nothing; its unpickling recurses,
    # so DL201 repairs it and the server starts ahead all the same.
    forwarder = run(tmp_path, "forwarder", args=("--ahead",))
    assert forwarder.rc == 0 and "AHEAD True True" in forwarder.stdout, forwarder
    assert forwarder.batches == reference.batches and started_by(forwarder) == ["server"]


def test_unrepaired_legacy_loader_fails_under_spawn(tmp_path):
    res = run(tmp_path, "legacy", shim=False)
    assert res.rc != 0 and "cannot pickle" in res.stderr, res


@pytest.mark.rule("DL209")
def test_repaired_loader_starts_warm_with_the_batches_of_spawn(tmp_path, reference):
    warm = run(tmp_path, "legacy")
    assert warm.rc == 0, warm
    # DL209 makes DL201's repair fast: a clause of its line; its record stays in the JSON log
    assert [r.code for r in logged(warm.stderr)] == ["DL201"], warm
    start_is_a_clause(warm, "warm forkserver")
    assert "summary: fixed DL201 x1, DL209 x1" in warm.stderr
    # the optimizer, built after the loader, changed os.environ: the workers still come
    # from the server
    assert "SETUP_CHANGED_ENV True" in warm.stdout, warm
    assert started_by(warm) == ["server"], warm
    cold = run(tmp_path, "legacy", env={"AUTOSAFE_TORCH_DISABLE": "DL209"})
    assert cold.rc == 0 and started_by(cold) == ["parent"], cold
    assert warm.batches == cold.batches == reference.batches
    # the main module is imported in every worker, as spawn does: never in the server
    assert warm.imports == cold.imports == reference.imports == 5


def test_a_healthy_spawn_loader_is_left_alone(tmp_path, reference):
    """Nothing recorded, no warm server started ahead (--ahead only looks) nor
    later: the workers come from plain spawn, with its batches."""
    res = run(tmp_path, "healthy", args=("--ahead",))
    assert res.rc == 0 and "AHEAD False False" in res.stdout, res
    assert res.records == [] and "DL2" not in res.stderr and started_by(res) == ["parent"], res
    assert res.batches == reference.batches


@pytest.mark.heavy  # make heavy (CI); make test stays under 10 minutes
def test_forkserver_needs_no_warm_start(tmp_path, reference):
    """Python's fork server has imported the main module (and torch) already."""
    res = run(tmp_path, "legacy", start="forkserver")
    assert res.rc == 0 and [r.code for r in logged(res.stderr)] == ["DL201"], res
    assert "DL209" not in res.stderr and "start warm" not in res.stderr
    plain = run(tmp_path, "healthy", shim=False, start="forkserver")
    assert res.batches == plain.batches


def test_as_on_macos_warm(tmp_path, reference):
    res = run(tmp_path, "legacy", start=None, env={"AUTOSAFE_TORCH_AS": "macos"})
    assert res.rc == 0, res
    start_is_a_clause(res, "warm forkserver")
    assert started_by(res) == ["server"]
    assert res.batches == reference.batches and res.imports == 5


@pytest.mark.heavy  # make heavy (CI); make test stays under 10 minutes
def test_as_on_windows_plain_spawn_logged(tmp_path, reference):
    res = run(tmp_path, "legacy", start=None, env={"AUTOSAFE_TORCH_AS": "windows"})
    assert res.rc == 0, res
    start_is_a_clause(res, "plain spawn", action="advised")  # nothing to change there
    (dl209,) = [r for r in res.records if r["code"] == "DL209"]
    assert "no fork server on win32" in dl209["why"] + dl209["done"], dl209  # why, said
    assert started_by(res) == ["parent"]
    assert res.batches == reference.batches


@pytest.mark.heavy  # 12 s: make heavy (CI)
def test_a_changed_environment_keeps_the_start_warm(tmp_path):
    """Each start request carries the parent's environment of that moment: when it
    changes between epochs (as building an optimizer does), workers still come from
    the server and see the new environment."""
    warm = run(tmp_path, "legacy", args=("--env-change",))
    assert warm.rc == 0, warm
    assert "plain spawn" not in warm.stderr, warm
    assert started_by(warm) == ["server"], warm
    plain = run(tmp_path, "healthy", shim=False, args=("--env-change",))
    assert warm.batches == plain.batches


def test_workers_exit_when_the_training_process_is_killed(tmp_path):
    res = run(tmp_path, "legacy", args=("--die",))
    assert res.rc == -9, res
    pids = [int(p) for line in res.stdout.splitlines() if line.startswith("WORKERS")
            for p in line.split()[1:]]
    assert pids, res
    deadline = time.time() + 30
    while time.time() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.2)
    assert not any(_alive(p) for p in pids), pids


def _alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


# -- in process -------------------------------------------------------------------------

def test_a_server_that_fails_falls_back_to_plain_spawn(monkeypatch, capsys):
    from multiprocessing import forkserver

    from autosafe_torch.remedies import warmstart

    def broken(self):
        raise OSError("no server today")

    monkeypatch.setattr(forkserver.ForkServer, "ensure_running", broken)
    monkeypatch.setattr(warmstart, "_state", {"server": None, "started_with": None,
                                              "cold": None})
    proc = warmstart.warm_context(None).Process(target=os.getpid)
    assert proc.name.startswith("Process-")
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0
    assert warmstart._state["cold"]


def test_only_installed_libraries_are_preloaded():
    import torch

    from autosafe_torch.remedies import warmstart

    class Local(torch.utils.data.Dataset):
        pass

    names = warmstart.libraries_for([Local(), None, torch.utils.data.default_collate])
    assert "torch" in names and "torch.utils.data._utils.collate" in names
    assert __name__ not in names and "__main__" not in names


def test_the_server_libraries_are_named_in_a_few_words():
    """A log line names the packages, not every module the server imports:
    the standard library left out, the news (not torch) first."""
    from autosafe_torch.remedies import warmstart

    imported = ["torch", "numpy", "autosafe_torch.remedies.warmserver", "threadlib",
                "torch.utils.data._utils.collate", "functools"]
    assert warmstart.named(imported, most=2) == "threadlib, torch and 1 more"
    assert warmstart.named(imported) == "threadlib, torch, numpy"
    assert warmstart.named([]) == "nothing"
