"""DL201: a dataset that holds threading's locks, sent to spawned workers as new,
unlocked ones (remedies/locks.py), with real workers where there is no fork rung.

tests/scenarios/locked_cache.py guards its cache with a Lock, its statistics with
an RLock, and holds a Condition and an Event. Spawn cannot send them ("cannot
pickle '_thread.lock' object"); forked workers get them unheld. The safe run is
fork, plainly; with the shim, spawn (as on Linux and as on macOS, where there is
no fork rung) and forkserver give its batches from real worker processes. A lock
held while the loader starts is never sent: on a Mac that is a clear refusal.
"""

import pytest

from support import json_log, logged, once_per_run, run_scenario, shim_lines

SCENARIO = "locked_cache.py"


def run(tmp_path, start_method, shim=True, platform=None, args=()):
    log = tmp_path / ("log-%s-%s.jsonl" % (start_method, platform))
    env = {"AUTOSAFE_TORCH_LOG_FILE": str(log)} if shim else {}
    if platform:
        env["AUTOSAFE_TORCH_AS"] = platform
    result = run_scenario(tmp_path, SCENARIO, activation="env" if shim else None,
                          start_method=start_method, env=env, args=args)
    return result, json_log(log)


def pids(result):
    return int(result.stdout.split("PIDS ")[1].split()[0])


@pytest.fixture(scope="module")
def forked(tmp_path_factory):
    """The safe run: fork, plainly (once in the whole test run)."""

    def batches():
        result, _ = run(tmp_path_factory.mktemp("forked"), "fork", shim=False)
        assert result.rc == 0 and result.batches, result
        return result.batches

    return once_per_run(tmp_path_factory, "locks-forked", batches)


@pytest.mark.rule("DL201")
@pytest.mark.parametrize("start_method, platform", [
    pytest.param("spawn", "macos"),
    pytest.param("spawn", None, marks=pytest.mark.heavy),
    pytest.param("forkserver", None, marks=pytest.mark.heavy)])
def test_locks_reach_spawned_workers_as_new_unlocked_ones(tmp_path, forked, start_method,
                                                          platform):
    plain, _ = run(tmp_path, start_method, shim=False)
    assert plain.rc != 0 and "cannot pickle '_thread.lock' object" in plain.stderr
    shim, records = run(tmp_path, start_method, platform=platform)
    assert shim.rc == 0, shim
    assert shim.batches == forked and pids(shim) == 2  # real worker processes
    (record,) = [r for r in records if r["code"] == "DL201"]
    assert "new unlocked locks" in record["strategy"] and record["action"] == "fixed"
    assert record["before"] == {"locks": ["dataset.lock", "dataset.stats_lock", "dataset.ready",
                                          "dataset.loaded"]}, record
    assert record["fix"].startswith("create locks lazily"), record
    (said,) = logged(shim.stderr, "DL201")  # on stderr, at that line, with its fix
    assert said.site == record["call_site"] and said.fix == record["fix"], said


def test_healthy_fork_loader_with_locks_is_left_alone(tmp_path, forked):
    shim, records = run(tmp_path, "fork")
    assert shim.rc == 0 and shim.batches == forked, shim
    assert records == [] and shim_lines(shim.stderr) == []


@pytest.mark.rule("DL201")
def test_a_lock_held_now_is_never_sent(tmp_path):
    shim, _ = run(tmp_path, "spawn", platform="macos", args=("held",))
    assert shim.rc != 0 and "NoExactRung" in shim.stderr, shim
    assert "dataset.lock (a threading lock) is held now" in shim.stderr


def test_the_reducer_refuses_a_held_lock_and_keeps_the_kind():
    import threading

    from autosafe_torch.remedies import locks

    reduce_lock = locks.lock_reducers()[type(threading.RLock())]
    make, args = reduce_lock(threading.RLock())
    assert type(make(*args)) is type(threading.RLock())
    held = threading.Lock()
    held.acquire()
    with pytest.raises(TypeError, match="held right now"):
        locks.lock_reducers()[type(held)](held)
