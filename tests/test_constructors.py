"""Exact or nothing for what a worker builds again (issue 40): real constructors.

tests/scenarios/constructors.py: datasets whose ``__init__`` makes what no spawned
worker can receive, written as real code writes them (a config ``main()``
changed, files shuffled with the global generator, an audit logger, a
constructor that counts and logs itself, ordinary arguments, a peek that fills
a cache). Plain spawn fails on each. What main() set reaches the worker before
it builds (DL220). The known-safe run is the safe platform's:
Linux, fork, without the shim. With the shim, as on macOS (no fork rung), the
dataset is built again in each worker by its constructor's call and checked
there, or the run stops with the one reason; on Linux spawn, fork is taken
(or a repair); in every case the program's own effects are those of the safe
run: its registry and counters, its log lines counted in the file, none of the
shim's lines among them, the audit lines in both files they reach.
"""

import pytest

from support import json_log, logged, once_per_run, run_scenario
from watch_gap import acted

SCENARIO = "constructors.py"
EXACT = ("days", "audit", "counted", "ordinary", "config", "weighted")
REFUSED = {"peeked": "its attribute cache holds other values"}
PLATFORMS = {"macos": ("spawn", {"AUTOSAFE_TORCH_AS": "macos"}),
             "windows": ("spawn", {"AUTOSAFE_TORCH_AS": "windows"}),
             "linux": ("spawn", {}),
             "forkserver": ("forkserver", {"AUTOSAFE_TORCH_AS": "linux-py314"})}
EFFECTS = ("REGISTRY", "MADE", "LOADING", "AUDIT", "TRAIN_AUDIT", "SHIM_IN_LOG")


def run(tmp_path, kind, platform=None, shim=True, start_method=None, args=(), env=None):
    method, platform_env = PLATFORMS.get(platform, (start_method, {}))
    log = tmp_path / ("log-%s-%s.jsonl" % (kind, platform))
    env = dict(platform_env, **(env or {}))
    if shim:
        env["AUTOSAFE_TORCH_LOG_FILE"] = str(log)
    result = run_scenario(tmp_path, SCENARIO, activation="env" if shim else None,
                          start_method=start_method or method, env=env, args=(kind,) + args)
    return result, (json_log(log) if shim else [])


def effects(result):
    out = {}
    for name in EFFECTS:
        tail = result.stdout.split(name + " ", 1)
        out[name] = int(tail[1].split()[0]) if len(tail) > 1 else None
    return out


def safe(tmp_path_factory, kind, args=()):
    """The safe platform's run (fork, no shim): batches and effects, once per test run."""

    def compute():
        result, _ = run(tmp_path_factory.mktemp("safe-" + kind), kind, shim=False,
                        start_method="fork", args=args)
        assert result.rc == 0 and result.batches, result
        return {"batches": result.batches, "effects": effects(result),
                "pids": effects_pids(result)}

    return once_per_run(tmp_path_factory, "constructors-safe-%s-%s" % (kind, "-".join(args)),
                        compute)


def effects_pids(result):
    return int(result.stdout.split("PIDS ")[1].split()[0])


def check_exact(result, reference):
    assert result.rc == 0, result
    assert result.batches == reference["batches"], result
    assert effects(result) == reference["effects"], result
    assert effects_pids(result) == reference["pids"]  # real worker processes, as many
    assert "autosafe_torch: summary: fixed" in result.stderr  # on stderr, always


@pytest.mark.rule("DL201", "DL219")
@pytest.mark.parametrize("kind", EXACT)
def test_a_rehearsed_mac_gets_real_workers_and_the_programs_effects(tmp_path,
                                                                     tmp_path_factory, kind):
    reference = safe(tmp_path_factory, kind)
    result, records = run(tmp_path, kind, "macos")
    check_exact(result, reference)
    dl201 = [r for r in records if r["code"] == "DL201"]
    assert dl201 and dl201[0]["action"] == "fixed"
    if kind == "audit":  # the handler made again, and the logger's configuration carried
        (carried,) = [r for r in records if r["code"] == "DL219"]
        assert carried["action"] == "fixed" and carried["before"] == {"loggers": ["audit"]}
        assert reference["effects"]["AUDIT"] == reference["effects"]["TRAIN_AUDIT"] == 48
    else:
        assert "build the dataset again" in dl201[0]["strategy"], dl201
        # once, in a build server every worker of every epoch was forked from (but
        # config's Arrow reader starts threads there: each worker builds its own)
        (warm,) = [r for r in records if r["code"] == "DL209"]
        assert ("the dataset built once, there, not in each worker" in warm["done"]) == (
            kind != "config"), warm
    if kind == "counted":  # the constructor ran once here, its line once in the file
        assert reference["effects"]["MADE"] == reference["effects"]["LOADING"] == 1
    carried = [r for r in records if r["code"] == "DL220"]
    if kind in ("config", "weighted"):  # as main() set it, in place before the build
        (record,) = carried
        assert [c["label"] for c in record["after"]["carried"]] == ["CONFIG"], record
        assert record["action"] == "fixed", record
    else:
        assert carried == [], records


@pytest.mark.rule("DL201")
@pytest.mark.parametrize("kind", sorted(REFUSED))
def test_what_a_worker_cannot_build_exactly_stops_with_the_reason(tmp_path, kind):
    """``config``: the worker's module has the default features, v1; ``peeked``: a
    peek filled the cache. Each worker checks what it built: no batch of another
    dataset, one reason, and the rung after it (emulated workers) cannot copy the
    reader either."""
    result, records = run(tmp_path, kind, "macos")
    assert result.rc != 0 and "NoExactRung" in result.stderr, result
    assert REFUSED[kind] in result.stderr and "BATCHES" not in result.stdout
    (record,) = [r for r in records if r["code"] == "DL201"]
    assert record["action"] == "failed" and REFUSED[kind] in record["done"], record


@pytest.mark.rule("DL201", "DL220")
def test_what_main_set_reaches_the_real_workers_of_a_repaired_loader(tmp_path,
                                                                      tmp_path_factory):
    """``runtime``: __getitem__ reads a class attribute and a module-level value that
    main() set. Spawned workers import the script again and would read the
    defaults: the values arrive with what each worker is sent, ahead of the
    dataset, and real workers give the safe run's batches and lines."""
    reference = safe(tmp_path_factory, "runtime")
    result, records = run(tmp_path, "runtime", "macos")
    check_exact(result, reference)
    (record,) = [r for r in records if r["code"] == "DL220"]
    assert record["action"] == "fixed", record
    assert sorted(c["label"] for c in record["after"]["carried"]) == ["CONFIG",
                                                                     "Runtime.factor"]
    assert all(r["action"] == "fixed" for r in records), records


@pytest.mark.rule("DL219")
@pytest.mark.parametrize("platform", ["macos", pytest.param("linux", marks=pytest.mark.heavy)])
def test_a_workers_own_logging_is_replaced_not_added_to(tmp_path, tmp_path_factory, platform):
    """The script configures logging at module level, unguarded: each spawned worker's
    import configures its root logger too. The carried configuration replaces it:
    every audit line once in each file, as under fork."""
    env = {"SCENARIO_LOG_AT_IMPORT": "1"}

    def compute():
        result, _ = run(tmp_path_factory.mktemp("safe-at-import"), "audit", shim=False,
                        start_method="fork", env=env)
        assert result.rc == 0, result
        return effects(result)

    reference = once_per_run(tmp_path_factory, "constructors-safe-audit-at-import", compute)
    assert reference["AUDIT"] == reference["TRAIN_AUDIT"] == 48
    result, records = run(tmp_path, "audit", platform, env=env)
    assert result.rc == 0 and effects(result) == reference, result
    assert [r["action"] for r in records if r["code"] == "DL219"] == ["fixed"]


@pytest.mark.parametrize("kind", ["days", "audit"])
def test_without_the_shim_spawn_fails(tmp_path, kind):
    result, _ = run(tmp_path, kind, shim=False, start_method="spawn")
    assert result.rc != 0 and ("cannot pickle" in result.stderr
                               or "__reduce__" in result.stderr), result


@pytest.mark.heavy
@pytest.mark.parametrize("kind", [k for k in EXACT + tuple(REFUSED) if k not in ("days",
                                                                                  "audit")])
def test_without_the_shim_spawn_fails_for_every_kind(tmp_path, kind):
    test_without_the_shim_spawn_fails(tmp_path, kind)


@pytest.mark.rule("DL201", "DL219")
@pytest.mark.parametrize("platform", [
    "linux",
    pytest.param("windows", marks=pytest.mark.heavy),
    pytest.param("forkserver", marks=pytest.mark.heavy)])
@pytest.mark.parametrize("kind", ["audit", "counted"])
def test_other_platforms_give_the_safe_run_too(tmp_path, tmp_path_factory, kind, platform):
    reference = safe(tmp_path_factory, kind)
    result, records = run(tmp_path, kind, platform)
    check_exact(result, reference)
    if platform == "linux" and kind == "counted":
        (record,) = [r for r in records if r["code"] == "DL201"]
        assert record["strategy"] == "start method: fork"  # Linux has the fork rung


@pytest.mark.heavy
@pytest.mark.parametrize("platform", ["windows", "forkserver", "linux"])
@pytest.mark.parametrize("kind", ["days", "ordinary"])
def test_every_exact_kind_on_every_platform(tmp_path, tmp_path_factory, kind, platform):
    check_exact(run(tmp_path, kind, platform)[0], safe(tmp_path_factory, kind))


def test_warn_mode_runs_no_user_code(tmp_path):
    """Warn mode changes nothing: the constructor runs once (its line once in the
    program's log), and torch's own pickling error stands."""
    result, records = run(tmp_path, "counted", "macos", env={"AUTOSAFE_TORCH_MODE": "warn"})
    assert result.rc != 0 and "__reduce__" in result.stderr, result
    lines = (tmp_path / "train.log").read_text().splitlines()
    assert [line for line in lines if " loading " in line] == ["constructors loading " +
                                                                tmp_path.name]
    assert [r["action"] for r in records if r["code"] == "DL201"] == ["would-fix"]


@pytest.mark.rule("DL201")
def test_every_loader_has_its_own_record(tmp_path, tmp_path_factory):
    """Two loaders made at one line, each rebuilt: two records in the JSON log, one
    line on stderr, the summary counts both."""
    reference = safe(tmp_path_factory, "days", ("--loaders", "2"))
    result, records = run(tmp_path, "days", "macos", args=("--loaders", "2"))
    check_exact(result, reference)
    assert [r["action"] for r in records if r["code"] == "DL201"] == ["fixed", "fixed"]
    assert len(logged(result.stderr, "DL201")) == 1
    assert "fixed DL201 x2" in result.stderr


@pytest.mark.rule("DL201", "DL209")
def test_a_server_started_ahead_does_not_reorder_the_next_datasets_files(tmp_path,
                                                                        tmp_path_factory):
    """The fork server started ahead for the first loader opens and closes
    descriptors in a thread of the shim's while the program builds its second
    dataset, whose files the shim records lowest number first: a number freed
    meanwhile gave them an order the constructor never opened them in, each
    worker's build "differed", and the run stopped for lack of an exact rung
    (compat saw it; 7 runs in 10 of a script like this one). The constructor
    and the thread take turns (opened.TURNS): the days' batches, both loaders
    fixed."""
    reference = safe(tmp_path_factory, "days", ("--loaders", "2"))
    result, records = run(tmp_path, "paced", "macos", args=("--loaders", "2"))
    check_exact(result, reference)
    assert "differs" not in result.stderr, result.stderr
    assert [r["action"] for r in records if r["code"] == "DL201"] == ["fixed", "fixed"]


def test_a_healthy_constructor_runs_as_often_as_the_program_calls_it(tmp_path,
                                                                      tmp_path_factory):
    """The hand fix (each handle opened where it is used) under spawn: with the shim
    as without it, the same batches, the constructor once, nothing recorded."""
    plain, _ = run(tmp_path, "counted", shim=False, start_method="spawn", args=("lazy",))
    assert plain.rc == 0 and effects(plain)["MADE"] == effects(plain)["LOADING"] == 1, plain
    result, records = run(tmp_path, "counted", start_method="spawn", args=("lazy",))
    assert result.rc == 0 and result.batches == plain.batches, result
    assert effects(result) == effects(plain) and records == [] and acted(result.stderr) == []
    forked, records = run(tmp_path, "counted", start_method="fork")
    assert forked.rc == 0 and records == [] and acted(forked.stderr) == []
    assert forked.batches == safe(tmp_path_factory, "counted")["batches"]
    assert effects(forked) == safe(tmp_path_factory, "counted")["effects"]
