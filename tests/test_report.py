"""What a person reads: the log line, the summary, and torch's own warnings.

A record is two lines, in the convention of compilers and linters::

    train.py:48: DL201 unpicklable-dataset: dataset.fh (an open file) reopened by path in each of 2 workers
      fix: open files lazily in __getitem__ (or in worker_init_fn), not in __init__

No repr of our internals, no memory address; the details go to the JSON log
and to AUTOSAFE_TORCH_DEBUG=1. Every test that runs a script with the shim
also checks each line it wrote (``support.assert_readable``).
"""  # noqa: E501 - the record above is one line, quoted whole

import os
import re
import sys

import pytest

from autosafe_torch import engine, report
from autosafe_torch.rules import RULES, brief, load_all
from support import (run_command, ROOT, cannot_pickle, clean_env, json_log, line_of, logged,
                     run_script, unreadable_lines)

EXAMPLES = ROOT / "examples"


def _demo(tmp_path, *options):
    """``autosafe-torch run --as macos examples/legacy_file_dataset.py``, from the
    repository root as the README shows it (the demo's own run)."""
    env = clean_env()
    proc = run_command([sys.executable, "-m", "autosafe_torch", "run", "--as", "macos",
                        *options, "examples/legacy_file_dataset.py"], ROOT, env, 180)
    return proc


def test_the_demo_says_what_was_done_to_what_in_two_lines(tmp_path):
    plain = run_command([sys.executable, str(EXAMPLES / "as_on_macos.py"),
                         str(EXAMPLES / "legacy_file_dataset.py")], os.getcwd(), clean_env(), 180)
    assert plain.returncode != 0 and re.search(cannot_pickle("BufferedReader"), plain.stderr)
    log = tmp_path / "run.jsonl"
    proc = _demo(tmp_path, "--log-file", str(log))
    assert proc.returncode == 0 and "read 8 batches" in proc.stdout, proc.stderr
    at = line_of(EXAMPLES, "for batch in loader", name="legacy_file_dataset.py")
    # DL209 (the warm start) makes DL201's repair fast: a clause of its line
    assert proc.stderr.splitlines() == [
        "examples/legacy_file_dataset.py:%d: DL201 unpicklable-dataset: dataset.file (an "
        "open file) reopened by path in each of 2 workers; workers start warm, from a fork "
        "server with torch, numpy imported" % at,
        "  fix: open files lazily in __getitem__ (or in worker_init_fn), not in __init__",
        "autosafe_torch: summary: fixed DL201 x1, DL209 x1; JSON log: %s" % log,
    ], proc.stderr
    # ... and the JSON log keeps both records, with every documented field
    records = json_log(log)
    assert [r["code"] for r in records] == ["DL201", "DL209"]
    for r in records:
        assert set(report.JSON_FIELDS) <= set(r), r
        assert r["call_site"] == "examples/legacy_file_dataset.py:%d" % at  # as Python names it
    assert records[0]["strategy"] == "repair: reopen read-only files by path in each worker"
    assert records[1]["strategy"] == "warm forkserver" and "worker_init_fn" in records[1]["after"]
    debug_adds_the_details_below_the_record(quiet_lines=len(proc.stderr.splitlines()))


def debug_adds_the_details_below_the_record(quiet_lines):
    """With AUTOSAFE_TORCH_DEBUG=1, the same demo run says more than ``quiet_lines``
    (the quiet run's, above; --log-file adds no line): the details, below the record."""
    env = clean_env({"AUTOSAFE_TORCH_DEBUG": "1"})
    debug = run_command([sys.executable, "-m", "autosafe_torch", "run", "--as", "macos",
                         "examples/legacy_file_dataset.py"], ROOT, env, 180)
    assert debug.returncode == 0, debug.stderr
    assert len(debug.stderr.splitlines()) > quiet_lines
    for detail in ("  strategy: repair: reopen read-only files by path in each worker",
                   "  strategy: warm forkserver", "  before: {'files': ['dataset.file']}"):
        assert detail in debug.stderr, debug.stderr
    assert re.search("  why: " + cannot_pickle("BufferedReader"), debug.stderr), debug.stderr


def test_a_record_is_two_short_lines_without_internals(capsys):
    """In process: a worker_init_fn of ours (a functools.partial around a
    module-level function) is never shown as a repr."""
    from autosafe_torch.remedies import warmstart
    from autosafe_torch.remedies.workerinit import with_step

    load_all()
    step = with_step(None, warmstart.exit_with_parent)
    assert "0x" in repr(step)  # what the old log line printed
    finding = RULES["DL207"].finding({"worker_init_fn": None}, {"worker_init_fn": step},
                                     "why " * 100, strategy="reopen in each worker")
    assert finding.done == "worker_init_fn None -> a step of autosafe_torch's"
    capsys.readouterr()
    engine.settle([finding], os.path.join(os.getcwd(), "train.py") + ":7")
    err = capsys.readouterr().err.rstrip("\n")
    assert err.splitlines() == [
        "train.py:7: DL207 shared-file-offset: worker_init_fn None -> a step of "
        "autosafe_torch's",
        "  fix: open the file in worker_init_fn or lazily in __getitem__"], err
    assert not unreadable_lines(err)


def test_a_long_text_is_cut_at_a_word_and_says_so():
    text = "word " * 80
    cut = report.shorten_line(text, 60)
    assert len(cut) <= 60 and cut.endswith("word...") and "wor..." not in cut
    assert report.shorten_line("one\nline  only", 60) == "one line only"


def test_values_are_shown_briefly():
    class Handle:
        pass

    assert brief(4) == "4" and brief(None) == "None" and brief("spawn") == "'spawn'"
    assert brief(len) == "len" and brief(Handle) == "test_values_are_shown_briefly.<locals>.Handle"
    assert brief(Handle()) == "a Handle" and brief("x" * 80) == "a string"
    assert report.without_addresses("<function f at 0x7f472c7a1bc0>") == "<function f>"


def test_paths_are_shown_relative_under_the_working_directory():
    here = os.getcwd()
    assert report.shown_site(os.path.join(here, "a", "train.py") + ":3") == "a/train.py:3"
    assert report.shown_site("/elsewhere/train.py:3 (via lib/x.py:9)") == \
        "/elsewhere/train.py:3 (via lib/x.py:9)"
    assert report.shown_site("Cell In[4], line 6") == "Cell In[4], line 6"
    assert report.shown_site("<string>:9") == "<string>:9"


def test_the_checker_refuses_long_lines_and_addresses():
    """``support.assert_readable`` runs on every test's shim output: it must
    catch what issue 20 found in the demo."""
    old = ("autosafe_torch[pid 4345]: DL209 warm-worker-start at /x/legacy.py:48: changed "
           "worker_init_fn None -> functools.partial(<function _run at 0x7f14a5506340>, "
           "(<function exit_with_par...")
    assert unreadable_lines(old) == [old]
    assert unreadable_lines("train.py:5: DL101 prefetch-without-workers: " + "x " * 120)
    fine = ("/a/very/long/path/%s/train.py:5: DL101 prefetch-without-workers: prefetch_factor "
            "4 -> None: num_workers=0\n  fix: pass prefetch_factor only when num_workers > 0"
            % ("deep/" * 60))
    assert unreadable_lines(fine) == []
    assert logged(fine)[0].fix == "pass prefetch_factor only when num_workers > 0"


def test_summary_is_one_line_of_counts_by_code(tmp_path):
    body = """
import torch
from torch.utils.data import DataLoader, TensorDataset
ds = TensorDataset(torch.arange(8.))
for epoch in range(3):
    digest(DataLoader(ds, batch_size=2, prefetch_factor=2))
digest(DataLoader(ds, batch_size=2, persistent_workers=True, prefetch_factor=2))
"""
    log = tmp_path / "out.jsonl"
    result = run_script(tmp_path, body, activation="env",
                        env={"AUTOSAFE_TORCH_LOG_FILE": str(log)})
    assert result.rc == 0, result
    summary = [line for line in result.stderr.splitlines() if "summary" in line]
    assert summary == ["autosafe_torch: summary: fixed DL101 x4 (2 call sites), DL102 x1; "
                       "JSON log: out.jsonl"], result


OUT_OF_DESCRIPTORS = """
import os, resource
import torch
from torch.utils.data import DataLoader, TensorDataset
ds = TensorDataset(torch.arange(8.))
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
held = []
try:
    while True:
        held.append(os.open(os.devnull, os.O_RDONLY))
except OSError:
    pass
loader = DataLoader(ds, batch_size=2, prefetch_factor=2)  # recorded with no descriptor left
for fd in held:
    os.close(fd)
digest(loader)
"""


@pytest.mark.rule("DL101")
def test_a_record_made_without_a_free_descriptor_reaches_the_json_log(tmp_path):
    """Out of descriptors (what DL213 recovers from) at the moment of a record:
    its JSON line is written once they are free, and the JSON log stays on."""
    log = tmp_path / "out.jsonl"
    result = run_script(tmp_path, OUT_OF_DESCRIPTORS, activation="env",
                        env={"AUTOSAFE_TORCH_LOG_FILE": str(log)})
    assert result.rc == 0 and "the JSON log is off" not in result.stderr, result
    assert [r["code"] for r in json_log(log)] == ["DL101"], result
    assert "JSON log: out.jsonl" in result.stderr, result
    # Still out of descriptors at exit: said, and the summary names no log.
    result = run_script(tmp_path, OUT_OF_DESCRIPTORS.replace("os.close(fd)", "pass")
                        .replace("digest(loader)", ""),
                        activation="env", env={"AUTOSAFE_TORCH_LOG_FILE": str(log)})
    assert result.rc == 0 and "cannot write the JSON log" in result.stderr, result
    assert "JSON log:" not in result.stderr and len(json_log(log)) == 1, result


# -- torch's own warnings, where torch raises them --------------------------------

MANY_WORKERS = """
import warnings
import torch
from torch.utils.data import DataLoader
warnings.simplefilter("default")
if __name__ == "__main__":
    loader = DataLoader(torch.arange(32.), batch_size=2, num_workers=16)
    digest(loader, epochs=2)
"""


def _warnings(stderr):
    return [line for line in stderr.splitlines() if re.search(r":\d+: UserWarning: ", line)]


def test_torch_s_worker_count_warning_points_where_it_points_without_the_shim(tmp_path):
    """16 workers on 1 usable CPU: torch warns (torch 2.13: at construction and at
    the start of iteration) naming its own lines (stacklevel=2), once each, by
    its registry: the same lines with the shim."""
    env = {"AUTOSAFE_TEST_CPUS": "1"}
    plain = run_script(tmp_path, MANY_WORKERS, env=env, start_method="fork")
    shimmed = run_script(tmp_path, MANY_WORKERS, env=env, start_method="fork",
                         activation="env")
    assert plain.rc == 0 and shimmed.rc == 0, (plain, shimmed)
    warned = _warnings(plain.stderr)  # twice on torch 2.13 (construction, iteration), once on 2.8
    assert warned and all("This DataLoader will create 16 worker processes" in w
                          and "torch/utils/data/dataloader.py" in w for w in warned), plain
    assert _warnings(shimmed.stderr) == warned, shimmed
    assert "autosafe_torch" not in shimmed.stderr and shimmed.batches == plain.batches


@pytest.mark.internal_error_expected
def test_internal_error_line_has_no_address(capsys):
    class Opaque:
        pass

    capsys.readouterr()
    report.internal_error("a test", TypeError("cannot use %r" % Opaque()))
    err = capsys.readouterr().err
    assert "internal error in a test (TypeError: cannot use <" in err and "0x" not in err
    assert not unreadable_lines(err), err
