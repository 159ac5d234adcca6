"""Real spawn workers for what a Mac user's dataset holds from __init__ (issue 34).

tests/scenarios/holders.py: a pyarrow ParquetFile, a safetensors handle, a pandas
chunk reader, a RotatingFileHandler, an anonymous mmap, a raw descriptor read
with os.pread. Spawn cannot send any of them. The known-safe twin is the hand
fix (each holder opened in the process that uses it), under spawn, plainly.
With the shim, spawn as on macOS (no fork rung), spawn as on Linux and
forkserver give the twin's batches from real worker processes:

- the ParquetFile, the safetensors handle and the pandas reader: where there
  is no fork rung, the dataset is built again in each worker from its
  constructor's arguments (remedies/rebuild.py); on Linux, fork;
- the handler is made again from its file (every worker's audit lines land);
- the anonymous map is shared through one block of shared memory;
- the descriptor is carried, and DL217 names it although pread moves no offset.

Beside each, the healthy control: under fork the script runs as it is, records
nothing and gives the twin's batches (make test: three kinds; make heavy: all).
"""

import pytest

from support import json_log, once_per_run, run_scenario, shim_lines

SCENARIO = "holders.py"
KINDS = ("parquet", "safetensors", "pandas", "handler", "anonmap", "pread")
REBUILT = ("parquet", "safetensors", "pandas")
PLATFORMS = {"macos": ("spawn", {"AUTOSAFE_TORCH_AS": "macos"}),
             "linux": ("spawn", {}),
             "forkserver": ("forkserver", {"AUTOSAFE_TORCH_AS": "linux-py314"})}


def run(tmp_path, kind, platform=None, shim=True, mode=None, start_method=None):
    method, env = PLATFORMS.get(platform, (start_method, {}))
    log = tmp_path / ("log-%s-%s.jsonl" % (kind, platform))
    env = dict(env, AUTOSAFE_TORCH_LOG_FILE=str(log)) if shim else {}
    args = (kind,) + ((mode,) if mode else ())
    result = run_scenario(tmp_path, SCENARIO, activation="env" if shim else None,
                          start_method=start_method or method, env=env, args=args)
    return result, (json_log(log) if shim else [])


def said(result, what):
    return int(result.stdout.split(what + " ")[1].split()[0])


def twin(tmp_path_factory, kind):
    """The hand fix under spawn, without the shim: the kind's known-safe batches
    (once in the whole test run: each kind's run, not every kind's, where it is needed)."""

    def batches():
        result, _ = run(tmp_path_factory.mktemp("twin-" + kind), kind, shim=False, mode="lazy",
                        start_method="spawn")
        assert result.rc == 0 and result.batches and said(result, "PIDS") == 2, result
        return result.batches

    return once_per_run(tmp_path_factory, "holders-twin-" + kind, batches)


def check_repaired(result, records, kind, platform, twin):
    assert result.rc == 0, result
    assert result.batches == twin and said(result, "PIDS") == 2  # real worker processes
    if kind == "handler":
        assert said(result, "AUDIT") == 24  # every worker's lines, none lost or doubled
    codes = {r["code"]: r for r in records}
    if kind == "pread":
        record = codes["DL217"]
        assert record["action"] == "fixed" and "dataset.held: rows.bin" in record["done"]
        return
    record = codes["DL201"]
    assert record["action"] == "fixed", record
    if kind in REBUILT:
        if platform == "macos":
            assert "build the dataset again" in record["strategy"]
            assert "dataset (a " in record["done"] and "built again by its constructor's " \
                "call, checked against this one there" in record["done"]
        else:
            assert record["strategy"] == "start method: fork"  # Linux has the fork rung
    elif kind == "handler":
        assert "make logging handlers again" in record["strategy"]
    elif kind == "anonmap":
        assert "share anonymous maps" in record["strategy"]


# make test shows, for these, the failure without the shim and the healthy fork
# control beside the repair (its 10 minutes); make heavy, for every kind.
QUICK = ("parquet", "handler", "pread")


def check_breaks_without_the_shim(tmp_path, kind, safe):
    plain, _ = run(tmp_path, kind, shim=False, start_method="spawn")
    assert plain.rc != 0 and plain.batches != safe, plain


def check_fork_is_left_alone(tmp_path, kind, safe):
    result, records = run(tmp_path, kind, start_method="fork")
    assert result.rc == 0 and result.batches == safe, result
    # The pandas reader's file is read by every forked worker through one shared
    # offset: DL207 gives each its own (its own rule and tests); nothing else acts.
    allowed = {"DL207"} if kind == "pandas" else set()
    assert {r["code"] for r in records} <= allowed, records
    if not allowed:
        assert shim_lines(result.stderr) == []


@pytest.mark.rule("DL201", "DL217")
@pytest.mark.parametrize("kind", KINDS)
def test_a_rehearsed_mac_gets_real_workers(tmp_path, tmp_path_factory, kind):
    safe = twin(tmp_path_factory, kind)
    if kind in QUICK:
        check_breaks_without_the_shim(tmp_path, kind, safe)
    result, records = run(tmp_path, kind, "macos")
    check_repaired(result, records, kind, "macos", safe)
    if kind in QUICK:
        check_fork_is_left_alone(tmp_path, kind, safe)


@pytest.mark.heavy
@pytest.mark.parametrize("kind", [kind for kind in KINDS if kind not in QUICK])
def test_without_the_shim_it_breaks_and_a_fork_loader_is_left_alone(tmp_path,
                                                                     tmp_path_factory, kind):
    safe = twin(tmp_path_factory, kind)
    check_breaks_without_the_shim(tmp_path, kind, safe)
    check_fork_is_left_alone(tmp_path, kind, safe)


@pytest.mark.heavy
@pytest.mark.rule("DL201", "DL217")
@pytest.mark.parametrize("platform", ["linux", "forkserver"])
@pytest.mark.parametrize("kind", KINDS)
def test_spawn_and_forkserver_on_linux(tmp_path, tmp_path_factory, kind, platform):
    result, records = run(tmp_path, kind, platform)
    check_repaired(result, records, kind, platform, twin(tmp_path_factory, kind))


@pytest.mark.rule("DL201")
def test_a_reader_advanced_after_construction_is_not_built_again(tmp_path):
    """The parent read a chunk before the loader: a new reader would start at the
    first chunk, forked workers at the second. No rung is exact on a Mac (the
    reader neither pickles nor copies): a clear refusal, never other batches."""
    result, records = run(tmp_path, "pandas", "macos", mode="changed")
    assert result.rc != 0 and "NoExactRung" in result.stderr, result
    assert "a TextReader" in result.stderr
    # and why the rung above it did not hold: each worker checked what it built, the
    # attribute that differs named, before any batch
    assert "the dataset (CsvChunks) built again in the worker differs: its attribute reader " \
        "holds other values" in result.stderr
    (record,) = [r for r in records if r["code"] == "DL201"]
    assert record["action"] == "failed" and "build the dataset again" in record["strategy"]
    assert "BATCHES" not in result.stdout
