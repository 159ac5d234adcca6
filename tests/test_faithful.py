"""Every rung gives the batches the requested workers give on a safe platform.

tests/scenarios/faithful.py draws from every random source a worker has
(torch, random, numpy's global state, a per-object RandomState and
Generator), puts the worker id and seed in each sample, and sets state in a
worker_init_fn. Made unpicklable in one ordinary way, it fails under spawn;
with autosafe_torch, as on macOS, Windows and Linux with Python 3.14
(``AUTOSAFE_TORCH_AS``), it gives the digest of 2 plain fork workers, and
leaves the parent's random state as they do.
"""


import pytest

from support import json_log, once_per_run, one_of, rotated, run_scenario

KINDS = ("lock", "lambda", "file", "generator")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """``reference(kind)``: 2 fork workers, no shim, nothing unpicklable in the
    way: the batches and the parent's random state a safe platform gives (run
    once in the whole test run, for the kinds the tests compare with)."""

    def stdout(kind):
        r = run_scenario(tmp_path_factory.mktemp("ref"), "faithful.py", start_method="fork",
                         args=(kind,))
        assert r.rc == 0, r
        return r.stdout

    return lambda kind: once_per_run(tmp_path_factory, "faithful-reference-" + kind,
                                     lambda: stdout(kind))


def _records(path):
    return json_log(path)


def test_the_digest_depends_on_the_worker_count(tmp_path, reference):
    """The control: another worker count gives other batches, so equality below
    means the requested workers were emulated, not just any loader."""
    three = run_scenario(tmp_path, "faithful.py", start_method="fork", args=("plain", "3"))
    zero = run_scenario(tmp_path, "faithful.py", start_method="fork", args=("plain", "0"))
    assert zero.rc != 0 or zero.stdout != reference("plain")  # no worker info with 0
    assert three.rc == 0 and three.stdout != reference("plain")


@pytest.mark.parametrize("kind", one_of(KINDS, "lock"))
def test_unpicklable_fails_under_spawn_without_the_shim(tmp_path, kind):
    bad = run_scenario(tmp_path, "faithful.py", start_method="spawn", args=(kind,))
    assert bad.rc != 0 and ("pickle" in bad.stderr or "Can't" in bad.stderr), bad


PLATFORMS = ("macos", "windows", "linux-py314")


@pytest.mark.parametrize("kind, platform", rotated(KINDS, PLATFORMS))
def test_as_on_each_platform_the_batches_of_two_fork_workers(tmp_path, reference, kind,
                                                              platform):
    log = tmp_path / "log.jsonl"
    good = run_scenario(tmp_path, "faithful.py", activation="env", args=(kind,),
                        env={"AUTOSAFE_TORCH_AS": platform,
                             "AUTOSAFE_TORCH_LOG_FILE": str(log)})
    assert good.rc == 0, good
    assert good.stdout == reference(kind)  # batches, then the parent's RNG state
    records = [r for r in _records(log) if r["code"].startswith("DL2") and r["code"] != "DL209"]
    strategies = {r["strategy"] for r in records}
    # repaired for spawn: the workers start warm (DL209); forkserver needs no warm start
    warm = {r["strategy"] for r in _records(log) if r["code"] == "DL209"}
    # for spawn: then warm where there is a fork server
    repaired = kind in ("file", "lambda", "lock") or kind == "generator" and \
        platform != "linux-py314"
    assert warm == ({"warm forkserver"} if repaired and platform == "macos" else
                    {"plain spawn"} if repaired and platform == "windows" else set())
    if kind == "file":  # repaired: reopened by path in each worker
        assert strategies == {"repair: reopen read-only files by path in each worker"}
    elif kind == "lambda":  # repaired: the lambda goes by value
        assert strategies == {"by-value"} and records[0]["code"] == "DL202"
    elif kind == "lock":  # repaired: a lock nobody holds goes as a new, unlocked one
        assert strategies == {"repair: new unlocked locks in each worker"}
        assert "create locks lazily" in records[0]["fix"]
    elif platform == "linux-py314":  # the generator: fork, where there is one
        assert strategies == {"start method: fork"}
        assert "keep no generator on the dataset" in records[0]["fix"]
    else:  # no fork rung: the dataset built again in each worker (an unstarted generator)
        assert strategies == {"repair: build the dataset again in each worker"}
        assert "built again by its constructor's call" in records[0]["done"]
