"""``autosafe-torch fix``: what a run fixed, turned into a patch of the script.

For each rewrite, a legacy script (tests/scenarios/fix/) runs under the shim
with a JSON log, under the start method where it fails; ``fix --write``
patches it; the patched script then runs plain, without the shim and with
warnings as errors, and gives the batches of the shim run; a new run under
the shim records nothing at the rewritten sites; a second ``fix`` changes
nothing; every line no rewrite touches, and every comment, is kept.

Then cases in this process, from hand-written logs: what must be left as a
comment, what must never be touched, and the one line without libcst.
"""

import argparse
import difflib
import io
import json
import re
import shutil
import sys
import time
import tokenize

import pytest

from support import (run_command, LOCAL_OBJECT, ROOT, SCENARIOS, cannot_pickle, clean_env, json_log,
                     run_file)
from test_amp import ROUTES_AUTOCAST, ROUTES_SCALER

from autosafe_torch.facts import pin_memory_warns

FIX = SCENARIOS / "fix"
PIN_MEMORY_WARNS = pin_memory_warns()  # DL105 fires where it does (torch 2.0: never)
WARNINGS_AS_ERRORS = "error::FutureWarning,error::UserWarning"
# The shim adds its worker step to every loader while cv2 is imported: a later
# run logs it again, and fix finds the calls after the import.
AT_IMPORT = ("CV401",)


# The lines of each scenario a rewrite may change (any other line is kept, or
# moved: under the main guard, or a local function to module level).
TOUCHED = {
    "loader_args": ("prefetch_factor=4", "persistent_workers=True", "timeout=60"),
    "amp_cpu": ("amp.", "amp import", "GradScaler(", "torch.autocast(device"),
    "cv2_workers": (),
    "unguarded": ("collate_fn=lambda",),
    "local_functions": ("collate_fn=lambda",),
    "file_dataset": ("self.file = open",),
}


def case(scenario, start_method, codes, failure, heavy=False):
    marks = (pytest.mark.heavy,) if heavy else ()
    return pytest.param(scenario, start_method, codes, failure, marks=marks,
                        id="%s-%s" % (scenario, start_method or "default"))


CASES = [
    # DL105 where torch warns of pin_memory without CUDA (not torch 2.0)
    case("loader_args", "fork", {"DL101", "DL102", "DL103", "DL107"} | (
        {"DL105"} if PIN_MEMORY_WARNS else set()),
         "ValueError: prefetch_factor option could only be specified"),
    # torch < 2.4: torch.cuda.amp is not deprecated (no AMP501, AMP502); torch 2.0
    # (make compat) refuses a torch.device as autocast's device type in other words
    case("amp_cpu", None, {"AMP503", "AMP505"} | (
        {"AMP501", "AMP502"} if ROUTES_AUTOCAST and ROUTES_SCALER else set()),
         r"ValueError: Expected `device_type` of type `str`|RuntimeError: User specified "
         r"autocast device_type must be 'cuda' or 'cpu'"),
    case("cv2_workers", "fork", set(AT_IMPORT), None),
    case("cv2_workers", "spawn", set(AT_IMPORT), None, heavy=True),
    case("unguarded", "spawn", {"DL204"}, "pickle", heavy=True),
    case("unguarded", "forkserver", {"DL204"}, "pickle", heavy=True),
    case("local_functions", "spawn", {"DL202"}, LOCAL_OBJECT),
    case("local_functions", "forkserver", {"DL202"}, LOCAL_OBJECT, heavy=True),
    case("file_dataset", "spawn", {"DL201"}, cannot_pickle("BufferedReader")),
    case("file_dataset", "forkserver", {"DL201"}, cannot_pickle("BufferedReader"),
         heavy=True),
    case("file_dataset", "fork", {"DL207"}, None),  # silently wrong batches, not a crash
]


def fix(tmp_path, log, *options):
    return run_command([sys.executable, "-m", "autosafe_torch", "fix", "--from", str(log),
                        *options], tmp_path, clean_env(), 120)


def logged(log):
    if not log.exists():  # a run that changed nothing writes no log
        return []
    return json_log(log)


def comments(text):
    return [t.string for t in tokenize.generate_tokens(io.StringIO(text).readline)
            if t.type == tokenize.COMMENT]


def assert_kept(original, patched, touched):
    """Every line of the original that no rewrite touched is in the patched file
    byte for byte, in order, or moved (4 spaces more under the main guard, 4
    fewer for a local function lifted to module level); every comment of the
    original is still there."""
    old, new = original.splitlines(True), patched.splitlines(True)
    matcher = difflib.SequenceMatcher(a=old, b=new, autojunk=False)
    changed = [old[i] for tag, i1, i2, _, _ in matcher.get_opcodes()
               if tag in ("replace", "delete") for i in range(i1, i2)]
    for line in changed:
        if not line.strip():
            continue  # a blank line that went with a function lifted out
        moved = "    " + line in new or (line.startswith("    ") and line[4:] in new)
        assert moved or any(t in line for t in touched), line
    left = comments(patched)
    for comment in comments(original):
        assert comment in left, comment


@pytest.mark.parametrize("scenario, start_method, codes, failure", CASES)
def test_the_patched_script_runs_plain_with_the_batches_of_the_shim(
        tmp_path, scenario, start_method, codes, failure):
    script = tmp_path / "train.py"
    shutil.copyfile(FIX / ("%s.py" % scenario), script)
    original = script.read_text()
    if failure:
        plain = run_file(tmp_path, script, start_method=start_method)
        assert plain.rc != 0 and re.search(failure, plain.output), plain  # a regex: the
        # words of pickle's errors change with Python (support.cannot_pickle)

    log = tmp_path / "run.jsonl"
    shim = run_file(tmp_path, script, "cli", start_method, cli_args=("--log-file", str(log)))
    assert shim.rc == 0 and shim.batches, shim
    assert codes <= {r["code"] for r in logged(log)}

    fixed = fix(tmp_path, log, "--write")
    assert fixed.returncode == 0, fixed.stderr
    for code in codes:
        assert re.search(r"^train\.py:\d+: %s rewritten: " % code, fixed.stderr, re.M), \
            fixed.stderr
    assert "left as a comment" not in fixed.stderr and "skipped" not in fixed.stderr, \
        fixed.stderr
    assert "wrote train.py" in fixed.stderr
    patched = script.read_text()
    assert patched != original
    assert_kept(original, patched, TOUCHED[scenario])

    plain = run_file(tmp_path, script, start_method=start_method,
                     env={"PYTHONWARNINGS": WARNINGS_AS_ERRORS})
    assert plain.rc == 0 and plain.batches == shim.batches, plain

    again_log = tmp_path / "again.jsonl"
    again = run_file(tmp_path, script, "cli", start_method,
                     cli_args=("--log-file", str(again_log)))
    assert again.rc == 0 and again.batches == shim.batches, again
    assert not [r for r in logged(again_log) if r["code"] in codes - set(AT_IMPORT)]

    # Idempotence: the first log is now stale (the file changed since), and the
    # new run's log asks for nothing that is not there.
    for stale_or_new in (log, again_log):
        if stale_or_new.exists():
            second = fix(tmp_path, stale_or_new, "--write")
            assert second.returncode == 0, second.stderr
            assert "rewritten" not in second.stderr, second.stderr
            assert script.read_text() == patched


def test_loader_arguments_read_the_calls_own_worker_count(tmp_path):
    """The rewrite as a user reads it (the diff, nothing written), and the
    patched call with workers."""
    script = tmp_path / "train.py"
    shutil.copyfile(FIX / "loader_args.py", script)
    log = tmp_path / "run.jsonl"
    assert run_file(tmp_path, script, "cli", cli_args=("--log-file", str(log))).rc == 0
    diff = fix(tmp_path, log)
    assert diff.returncode == 0 and script.read_text() == (FIX / "loader_args.py").read_text()
    added = [line[1:].strip() for line in diff.stdout.splitlines() if line.startswith("+ ")]
    said = ["# autosafe-torch DL101: prefetch_factor only with workers",
            "# autosafe-torch DL102: persistent_workers only with workers",
            "# autosafe-torch DL103: multiprocessing_context only with workers",
            "# autosafe-torch DL107: timeout only with workers"]
    said += ["# autosafe-torch DL105: pin_memory only with CUDA"] if PIN_MEMORY_WARNS else []
    n = len(said)
    assert added[:n] == said
    assert "prefetch_factor=4 if NUM_WORKERS > 0 else None,  # tuned on the cluster" in added[n]
    assert "persistent_workers=NUM_WORKERS > 0, " \
           'multiprocessing_context="fork" if NUM_WORKERS > 0 else None,' in added[n + 1]
    assert added[n + 2] == "timeout=60 if NUM_WORKERS > 0 else 0, " + (
        "pin_memory=torch.cuda.is_available())" if PIN_MEMORY_WARNS else "pin_memory=True)")
    # With workers, the arguments reach torch as written (persistent workers, so
    # the second epoch's order differs from a run without: torch's, not ours).
    assert fix(tmp_path, log, "--write").returncode == 0
    with_workers = run_file(tmp_path, script, env={"NUM_WORKERS": "2",
                                                   "PYTHONWARNINGS": WARNINGS_AS_ERRORS})
    assert with_workers.rc == 0 and with_workers.batches, with_workers


# -- in this process, from hand-written logs ------------------------------------------


def run_fix(tmp_path, text, records, write=True):
    """``fix`` on ``text`` (as train.py) and a log of ``records`` (code, line,
    and any other field): (new text, summary)."""
    from autosafe_torch.codemod import main

    script = tmp_path / "train.py"
    script.write_text(text)
    log = tmp_path / "run.jsonl"
    with log.open("w") as f:
        for record in records:
            record = dict(record)
            record.setdefault("call_site", "train.py:%d" % record.pop("line", 1))
            record.setdefault("time", time.time() + 60)
            record.setdefault("fix", "the permanent fix of %s" % record["code"])
            f.write(json.dumps(record) + "\n")
    out, err = io.StringIO(), io.StringIO()
    assert main(argparse.Namespace(log=str(log), write=write, root=str(tmp_path)), out,
                err) == 0
    return script.read_text(), err.getvalue()


def test_old_positional_amp_arguments_are_given_by_name(tmp_path):
    text = ("import torch\n"
            "with torch.cuda.amp.autocast(False, torch.bfloat16):\n"
            "    pass\n"
            "a = torch.cuda.amp.GradScaler(1024.0, 3.0)\n"
            "b = torch.cuda.amp.GradScaler(device='cuda')\n")
    records = [{"code": "AMP501", "line": 2, "before": {"api": "torch.cuda.amp.autocast"}},
               {"code": "AMP502", "line": 4, "before": {"api": "torch.cuda.amp.GradScaler"}},
               {"code": "AMP502", "line": 5, "before": {"api": "torch.cuda.amp.GradScaler"}},
               {"code": "AMP504", "line": 5, "before": {"device": "cuda"}}]
    new, summary = run_fix(tmp_path, text, records)
    assert 'with torch.amp.autocast("cuda", enabled=False, dtype=torch.bfloat16):' in new
    assert 'a = torch.amp.GradScaler("cuda", init_scale=1024.0, growth_factor=3.0)' in new
    assert "b = torch.amp.GradScaler('cuda')" in new
    assert "train.py:5: AMP504 nothing to change" in summary


def test_without_a_worker_count_the_argument_goes(tmp_path):
    text = ("from torch.utils.data import DataLoader\n"
            "loader = DataLoader(ds, batch_size=2,\n"
            "                    persistent_workers=True)\n")
    new, _ = run_fix(tmp_path, text, [{"code": "DL102", "line": 2,
                                       "after": {"persistent_workers": False}}])
    assert new.endswith("loader = DataLoader(ds, batch_size=2)\n")


def test_advice_and_unknown_rules_become_comments_once(tmp_path):
    text = ("from torch.utils.data import DataLoader\n"
            "loader = DataLoader(ds, num_workers=64)  # many\n")
    record = {"code": "DL104", "line": 2, "fix": "num_workers=min(wanted, cpus)"}
    new, summary = run_fix(tmp_path, text, [record])
    assert new == ("from torch.utils.data import DataLoader\n"
                   "# autosafe-torch DL104: num_workers=min(wanted, cpus)\n"
                   "loader = DataLoader(ds, num_workers=64)  # many\n")
    assert "train.py:2: DL104 left as a comment: no rewrite for DL104" in summary
    again, _ = run_fix(tmp_path, new, [dict(record, line=3)])  # a later run's log
    assert again == new


def test_only_the_users_files_are_touched(tmp_path):
    import torch.utils.data.dataloader as library

    import autosafe_torch.engine as ours

    library_text = open(library.__file__).read()
    records = [{"code": "DL101", "call_site": "%s:100" % library.__file__},
               {"code": "DL101", "call_site": "%s:10" % ours.__file__},
               {"code": "DL210", "call_site": "<unknown>"},
               {"code": "DL101", "call_site": "gone.py:3"},
               {"code": "DL101", "call_site": "train.py:1 (via lightning/data.py:325)",
                "after": {"prefetch_factor": None}}]
    new, summary = run_fix(tmp_path, "from torch.utils.data import DataLoader as L\n"
                           "x = L(d, prefetch_factor=2)\n", records)
    assert "%s:100: DL101 skipped: a library's file" % library.__file__ in summary
    assert "%s:10: DL101 skipped: autosafe_torch's own file" % ours.__file__ in summary
    assert "<unknown>: DL210 skipped: no file and line of yours" in summary
    assert "gone.py:3: DL101 skipped: no such file here" in summary
    assert "train.py:1: DL101 left as a comment: no DataLoader(...) call" in summary
    assert open(library.__file__).read() == library_text


def test_a_hostile_log_writes_nothing_outside_the_project(tmp_path):
    """A log names files elsewhere, by an absolute path, by ``..``, through its
    ``cwd`` and through a link inside the project: ``fix --write``, run in the
    project, refuses each with a line and changes none of them; the project's
    own file is rewritten; ``--root`` widens it."""
    loader = "from torch.utils.data import DataLoader\nx = DataLoader(d, prefetch_factor=2)\n"
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir()
    elsewhere.mkdir()
    victims = {name: elsewhere / name for name in ("absolute.py", "dotdot.py", "cwd.py",
                                                   "linked.py")}
    for victim in victims.values():
        victim.write_text(loader)
    (project / "link.py").symlink_to(victims["linked.py"])
    (project / "train.py").write_text(loader)
    sites = [(str(victims["absolute.py"]), None), ("../elsewhere/dotdot.py", None),
             ("cwd.py", str(elsewhere)), ("link.py", None), ("train.py", None)]
    log = project / "hostile.jsonl"
    log.write_text("".join(json.dumps(dict(
        {"code": "DL101", "call_site": "%s:2" % site, "time": time.time() + 60,
         "after": {"prefetch_factor": None}, "fix": "pass prefetch_factor only with workers"},
        **({"cwd": cwd} if cwd else {}))) + "\n" for site, cwd in sites))
    result = run_command([sys.executable, "-m", "autosafe_torch", "fix", "--from", str(log),
                          "--write"], project, clean_env(), 120)
    assert result.returncode == 0, result
    refused = [line for line in result.stderr.splitlines() if "outside this directory" in line]
    assert len(refused) == 4, result.stderr
    assert all(v.read_text() == loader for v in victims.values())
    assert "prefetch_factor=2 if" not in loader and \
        (project / "train.py").read_text() != loader, result.stderr
    widened = run_command([sys.executable, "-m", "autosafe_torch", "fix", "--from", str(log),
                           "--root", str(tmp_path)], project, clean_env(), 120)
    assert widened.returncode == 0 and "outside" not in widened.stderr, widened.stderr


def test_main_guard_keeps_definitions_and_what_they_read(tmp_path):
    text = ('"""Doc."""\n'
            "import torch\n"
            "SCALE = 2  # read by the dataset\n"
            "seen = []\n"
            "class DS:\n"
            "    def get(self):\n"
            "        return SCALE\n"
            "torch.manual_seed(0)\n"
            "for x in DataLoader(DS(), num_workers=2):\n"
            "    seen.append(x)\n")
    new, summary = run_fix(tmp_path, text, [{"code": "DL204", "line": 9}])
    assert new == ('"""Doc."""\n'
                   "import torch\n"
                   "SCALE = 2  # read by the dataset\n"
                   "class DS:\n"
                   "    def get(self):\n"
                   "        return SCALE\n"
                   "\n\n"
                   "# autosafe-torch DL204: the training code runs only as a script, not in "
                   "spawned workers\n"
                   'if __name__ == "__main__":\n'
                   "    seen = []\n"
                   "    torch.manual_seed(0)\n"
                   "    for x in DataLoader(DS(), num_workers=2):\n"
                   "        seen.append(x)\n")
    assert "DL204 rewritten" in summary


NOT_EXACT = [
    ("from torch.utils.data import DataLoader\n"
     "def main(args):\n"
     "    loader = DataLoader(args.ds, num_workers=int(args.workers), prefetch_factor=4)\n",
     {"code": "DL101", "line": 3, "after": {"prefetch_factor": None}},
     "num_workers is computed at the call"),
    ("import torch\nfor x in loader:\n    pass\nif __name__ == '__main__':\n    pass\n",
     {"code": "DL204", "line": 2}, "the file has a main guard"),
    ("import torch\nfor n in loader:\n    pass\nclass DS:\n    size = n\n",
     {"code": "DL204", "line": 2}, "line 4 binds or reads n"),
    ("import torch\ndef train(loader):\n    for x in loader:\n        pass\nprint(1)\n",
     {"code": "DL204", "line": 3}, "the loader is iterated in train, which this file's"),
    ("from torch.utils.data import DataLoader\n"
     "def main(ds):\n"
     "    k = 1\n"
     "    loader = DataLoader(ds, num_workers=2, collate_fn=lambda b: b * k)\n"
     "    k = 2\n"
     "    for x in loader:\n"
     "        pass\n",
     {"code": "DL202", "line": 6, "before": {"collate_fn": "<lambda>"}},
     "it reads k, assigned more than once"),
    ("from torch.utils.data import DataLoader\n"
     "class DS:\n"
     "    def __init__(self, path):\n"
     "        self.f = open(path, 'rb')\n"
     "    def __len__(self):\n"
     "        return len(self.f.read())\n"
     "    def __getitem__(self, i):\n"
     "        return self.f.read(1)\n"
     "loader = DataLoader(DS('x'), num_workers=2)\n",
     {"code": "DL201", "line": 9, "before": {"file": "dataset.f"}},
     "self.f is used in __len__ too"),
]


@pytest.mark.parametrize("text, record, reason", NOT_EXACT,
                         ids=[r for _, _, r in NOT_EXACT])
def test_where_a_rewrite_would_not_be_exact_the_fix_is_a_comment(tmp_path, text, record,
                                                                 reason):
    new, summary = run_fix(tmp_path, text, [record])
    code = record["code"]
    assert "%s left as a comment: %s" % (code, reason) in summary
    comment = "# autosafe-torch %s: the permanent fix of %s" % (code, code)
    assert comment in new
    assert [line for line in new.splitlines() if line.strip() != comment] == text.splitlines()


def test_a_file_that_does_not_parse_is_left_alone(tmp_path):
    new, summary = run_fix(tmp_path, "print 'python 2'\n", [{"code": "DL101", "line": 1}])
    assert new == "print 'python 2'\n"
    assert "train.py:1: DL101 skipped: not rewritten (ParserSyntaxError: " in summary
    assert len(summary.splitlines()) == 2


def test_without_libcst_one_line_says_how_to_install(tmp_path):
    blocker = tmp_path / "blocked" / "libcst"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('No module named libcst')\n")
    env = clean_env({"PYTHONPATH": str(blocker.parent)})
    proc = run_command([sys.executable, "-m", "autosafe_torch", "fix", "--from", "x.jsonl"],
                       tmp_path, env, 120)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "autosafe-torch fix: needs libcst, to rewrite your source keeping its formatting: "
        "pip install 'autosafe-torch[fix]'"]


def test_a_missing_log_is_one_line(tmp_path):
    proc = fix(tmp_path, tmp_path / "none.jsonl")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "no log at" in proc.stderr and "Traceback" not in proc.stderr


def test_the_package_declares_libcst_as_the_fix_extra():
    text = (ROOT / "pyproject.toml").read_text()
    assert 'fix = ["libcst>=1.1"]' in text
