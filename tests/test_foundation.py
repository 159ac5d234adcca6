"""The pipeline every rule plugs into: activation, modes, log, fail-open, CLI.

All behaviour is checked in real subprocesses; DL101 (prefetch_factor with
num_workers=0) serves as the probe rule because its failure is a ValueError.
"""

import json
import os
import signal
import subprocess
import sys
import sysconfig

import pytest

from autosafe_torch.facts import pin_memory_warns
from support import clean_env, line_of, logged, run_command, run_script

BROKEN_LOADER = '''
import torch
from torch.utils.data import DataLoader, TensorDataset
ds = TensorDataset(torch.arange(8.))
def make():
    return DataLoader(ds, batch_size=2, prefetch_factor=2)
'''

DL101_ERROR = "prefetch_factor option could only be specified in multiprocessing"


def test_kill_switch_wins_over_import(tmp_path):
    result = run_script(tmp_path, BROKEN_LOADER + "digest(make())\n", activation="import",
                        env={"AUTOSAFE_TORCH": "0"})
    assert result.rc != 0 and DL101_ERROR in result.stderr


def test_import_exports_the_switch_for_children(tmp_path):
    body = "import os, subprocess, sys\nprint('ENV', os.environ.get('AUTOSAFE_TORCH'))\n"
    result = run_script(tmp_path, body, activation="import")
    assert "ENV 1" in result.stdout, result


def test_loader_made_every_epoch_logs_once(tmp_path):
    body = BROKEN_LOADER + "for epoch in range(3):\n    digest(make())\n"
    log = tmp_path / "interventions.jsonl"
    result = run_script(tmp_path, body, activation="env",
                        env={"AUTOSAFE_TORCH_LOG_FILE": str(log), "RANK": "3"})
    assert result.rc == 0, result
    (rec,) = logged(result.stderr, "DL101")
    assert rec.site == "train.py:%d" % line_of(tmp_path, "return DataLoader"), result
    assert rec.done == "prefetch_factor 2 -> None: num_workers=0 (rank 3)", rec
    assert rec.fix == "pass prefetch_factor only when num_workers > 0", rec
    summary = [line for line in result.stderr.splitlines() if "summary" in line]
    assert summary == ["autosafe_torch[rank 3]: summary: fixed DL101 x3; JSON log: %s"
                       % log.name], result
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(records) == 1
    rec = records[0]
    assert rec["code"] == "DL101" and rec["slug"] == "prefetch-without-workers"
    assert rec["before"] == {"prefetch_factor": 2} and rec["after"] == {"prefetch_factor": None}
    assert rec["action"] == "fixed" and rec["rank"] == 3 and rec["call_site"].endswith(
        ":%d" % line_of(tmp_path, "return DataLoader"))
    assert set(rec) == {"time", "pid", "rank", "code", "slug", "action", "strategy",
                        "call_site", "cwd", "before", "after", "why", "fix", "done"}
    assert rec["done"] == "prefetch_factor 2 -> None: num_workers=0"


def test_interventions_api(tmp_path):
    body = BROKEN_LOADER + """
import autosafe_torch
make(); make()
recs = autosafe_torch.interventions()
print("RECS", [(r.code, r.count, r.call_site.rsplit(":", 1)[1]) for r in recs])
"""
    result = run_script(tmp_path, body, activation="env")
    line = line_of(tmp_path, "return DataLoader")
    assert "RECS [('DL101', 2, '%d')]" % line in result.stdout, result


def test_warn_mode_logs_and_changes_nothing(tmp_path):
    result = run_script(tmp_path, BROKEN_LOADER + "make()\n", activation="env",
                        env={"AUTOSAFE_TORCH_MODE": "warn"})
    assert result.rc != 0 and DL101_ERROR in result.stderr
    (rec,) = logged(result.stderr, "DL101")
    assert rec.done == "not applied (warn mode): prefetch_factor 2 -> None: num_workers=0"
    assert "summary: would fix DL101 x1" in result.stderr


def test_strict_mode_raises_naming_rule_and_fix(tmp_path):
    body = BROKEN_LOADER + """
import autosafe_torch
try:
    make()
except autosafe_torch.UnsafeCallError as exc:
    print("STRICT", exc.code, exc)
"""
    result = run_script(tmp_path, body, activation="env", env={"AUTOSAFE_TORCH_MODE": "strict"})
    assert result.rc == 0, result
    at = line_of(tmp_path, "return DataLoader")
    assert ("STRICT DL101 train.py:%d: DL101 prefetch-without-workers: refused "
            "(AUTOSAFE_TORCH_MODE=strict), not applied: prefetch_factor 2 -> None: "
            "num_workers=0\n  fix: pass prefetch_factor only when num_workers > 0" % at) \
        in result.stdout, result


@pytest.mark.parametrize("disable", ["DL101", "dataloader", "*"])
def test_disable_by_code_group_or_all(tmp_path, disable):
    result = run_script(tmp_path, BROKEN_LOADER + "make()\n", activation="env",
                        env={"AUTOSAFE_TORCH_DISABLE": disable})
    assert result.rc != 0 and DL101_ERROR in result.stderr


def test_configure_from_code(tmp_path):
    body = BROKEN_LOADER + """
import autosafe_torch
autosafe_torch.configure(mode="warn")
try:
    make()
except ValueError:
    print("WARN-MODE-RAISED")
autosafe_torch.configure(mode="fix", disable=["DL102"])
digest(make())
autosafe_torch.configure(mode="shout")
"""
    result = run_script(tmp_path, body, activation="import")
    assert result.rc == 0, result
    assert "WARN-MODE-RAISED" in result.stdout and "BATCHES" in result.stdout
    assert "configure(mode=...)='shout' is not one of fix/warn/strict; using fix" in result.stderr


def test_quiet_silences_the_log_but_still_fixes(tmp_path):
    result = run_script(tmp_path, BROKEN_LOADER + "digest(make())\n", activation="env",
                        env={"AUTOSAFE_TORCH_QUIET": "1"})
    assert result.rc == 0 and "autosafe_torch" not in result.stderr, result


def test_the_applications_logging_keeps_its_own_lines(tmp_path):
    """``logging.basicConfig(filename=...)``: the application's file gets its own
    lines and none of ours; ours, the summary too, reach stderr."""
    body = ("import logging, sys\n"
            "logging.basicConfig(filename='train.log', level=logging.INFO,\n"
            "                    format='APP %(name)s %(message)s')\n"
            "logging.getLogger('app').info('started')\n") + BROKEN_LOADER + "digest(make())\n"
    result = run_script(tmp_path, body, activation="env")
    assert result.rc == 0, result
    at = line_of(tmp_path, "return DataLoader")
    assert (tmp_path / "train.log").read_text().splitlines() == ["APP app started"]
    assert "train.py:%d: DL101 prefetch-without-workers" % at in result.stderr, result
    assert "autosafe_torch: summary: fixed DL101 x1" in result.stderr


def test_a_handler_on_our_logger_gets_our_lines_too(tmp_path):
    body = ("import logging, sys\nh = logging.StreamHandler(sys.stdout)\n"
            "h.setFormatter(logging.Formatter('OURS %(message)s'))\n"
            "logging.getLogger('autosafe_torch').addHandler(h)\n") + BROKEN_LOADER + "make()\n"
    result = run_script(tmp_path, body, activation="env")
    assert result.rc == 0, result
    at = line_of(tmp_path, "return DataLoader")
    assert "OURS train.py:%d: DL101 " % at in result.stdout
    assert "train.py:%d: DL101 " % at in result.stderr


def test_activation_after_torch_patches_and_says_so(tmp_path):
    body = "import torch\nimport autosafe_torch\n" + BROKEN_LOADER + "digest(make())\n"
    result = run_script(tmp_path, body)
    assert result.rc == 0, result
    assert "activated after torch was imported" in result.stderr
    assert "objects created before now were not checked" in result.stderr


def test_deactivate_restores_the_original(tmp_path):
    body = """
import autosafe_torch, torch
from torch.utils.data import DataLoader
patched = DataLoader.__init__
autosafe_torch.deactivate()
print("RESTORED", type(DataLoader.__dict__["__init__"]).__name__,
      DataLoader.__init__ is not patched)
autosafe_torch.activate()
print("AGAIN", type(DataLoader.__dict__["__init__"]).__name__)
"""
    result = run_script(tmp_path, body)
    assert "RESTORED function True" in result.stdout, result
    assert "AGAIN FunctionWrapper" in result.stdout, result


def test_subclass_and_positional_arguments(tmp_path):
    body = """
import torch
from torch.utils.data import DataLoader, TensorDataset

class MyLoader(DataLoader):
    def __init__(self, ds, **kwargs):
        super().__init__(ds, **kwargs)

ds = TensorDataset(torch.arange(8.))
a = MyLoader(ds, batch_size=2, persistent_workers=True)
# pin_memory positional (8th), timeout positional (10th)
b = DataLoader(ds, 2, False, None, None, 0, None, True, False, 7)
print("PIN", b.pin_memory, b.timeout, a.persistent_workers)
"""
    result = run_script(tmp_path, body, activation="env")
    assert result.rc == 0, result
    warns = pin_memory_warns()  # torch 2.0 ignores pin_memory silently: DL105 leaves it
    assert "PIN %s 0 False" % (not warns) in result.stdout
    sites = [r.site for r in logged(result.stderr)]
    a, b = line_of(tmp_path, "a = MyLoader("), line_of(tmp_path, "b = DataLoader(")
    assert sites == ["train.py:%d" % a] + ["train.py:%d" % b] * (2 if warns else 1), \
        result.stderr  # the user's lines, not the subclass's


def test_user_type_errors_are_torch_s_own(tmp_path):
    body = "import torch\nfrom torch.utils.data import DataLoader\nDataLoader([1], bogus=1)\n"
    result = run_script(tmp_path, body, activation="env")
    assert "unexpected keyword argument 'bogus'" in result.stderr
    assert "internal error" not in result.stderr


# Faults injected into each layer: the user's call must run as without us.
FAULTS = {
    "rule": "import autosafe_torch.rules as m\n"
            "def boom(*a):\n    raise RuntimeError('injected')\n"
            "boom.rule = m.load_all()['DL101']\n"
            "m._checks['dataloader.init'][:] = [boom]\n",
    "facts": "import autosafe_torch.facts as m\n"
             "def boom(*a, **k):\n    raise RuntimeError('injected')\nm.current = boom\n",
    "logger": "import autosafe_torch.report as m\n"
              "def boom(*a, **k):\n    raise RuntimeError('injected')\nm.record = boom\n",
    "callsite": "import autosafe_torch.callsite as m\n"
                "def boom(*a, **k):\n    raise RuntimeError('injected')\nm.loader_site = boom\n",
}


@pytest.mark.internal_error_expected
@pytest.mark.parametrize("layer", sorted(FAULTS))
def test_fail_open_in_each_layer(tmp_path, layer):
    body = FAULTS[layer] + """
import torch
from torch.utils.data import DataLoader, TensorDataset
ds = TensorDataset(torch.arange(8.))
digest(DataLoader(ds, batch_size=2))             # a fine loader still works
for i in range(2):
    try:
        DataLoader(ds, batch_size=2, prefetch_factor=2)
    except ValueError as exc:
        print("ORIGINAL-ERROR", exc)
"""
    result = run_script(tmp_path, body, activation="import")
    assert result.rc == 0, result
    assert "BATCHES" in result.stdout
    assert result.stdout.count("ORIGINAL-ERROR prefetch_factor option") == 2, result
    assert result.stderr.count(
        "internal error in DataLoader.__init__ (RuntimeError: injected)") == 1


@pytest.mark.internal_error_expected
def test_fail_open_at_iteration(tmp_path):
    """A fault in the worker decision: the loader starts its workers as asked."""
    body = """
import autosafe_torch.rules as m
def boom(*a, **k):
    raise RuntimeError('injected')
boom.rule = m.load_all()['DL201']
m._checks['dataloader.iter'].insert(0, boom)
import torch
from torch.utils.data import DataLoader
if __name__ == "__main__":
    loader = DataLoader(torch.arange(8.), batch_size=2, num_workers=2)
    digest(loader, epochs=2)
"""
    result = run_script(tmp_path, body, activation="import")
    ref = run_script(tmp_path, body.replace("num_workers=2", "num_workers=0"))
    assert result.rc == 0 and result.batches == ref.batches, result
    assert result.stderr.count("internal error in DataLoader iteration (RuntimeError: "
                               "injected)") == 1


@pytest.mark.internal_error_expected
def test_fail_open_import_hook(tmp_path):
    """A broken patch never breaks `import torch`."""
    body = """
import autosafe_torch.patches as p
p.TARGETS["torch"] = ("autosafe_torch.no_such_patch",)
import torch
print("TORCH", torch.__version__)
"""
    result = run_script(tmp_path, body, activation="import")
    assert result.rc == 0 and "TORCH" in result.stdout, result
    assert result.stderr.count("internal error in patching autosafe_torch.no_such_patch") == 1


@pytest.mark.internal_error_expected
def test_debug_shows_traceback(tmp_path):
    body = FAULTS["rule"] + BROKEN_LOADER + "try:\n    make()\nexcept ValueError:\n    pass\n"
    result = run_script(tmp_path, body, activation="import", env={"AUTOSAFE_TORCH_DEBUG": "1"})
    assert "Traceback" in result.stderr and "injected" in result.stderr


# ---- the CLI ---------------------------------------------------------------

def test_cli_passes_exit_code_and_argv(tmp_path):
    body = ("import sys\nprint('ARGV', sys.argv[1:], sys.path[0] == %r)\nsys.exit(3)\n"
            % str(tmp_path))
    result = run_script(tmp_path, body, activation="cli", args=("a", "--b"))
    assert result.rc == 3 and "ARGV ['a', '--b'] True" in result.stdout, result


def test_cli_passes_signals(tmp_path):
    body = "import os, signal\nos.kill(os.getpid(), signal.SIGTERM)\n"
    result = run_script(tmp_path, body, activation="cli")
    assert result.rc == -signal.SIGTERM, result


def test_cli_options_and_module(tmp_path):
    (tmp_path / "mymod.py").write_text(BROKEN_LOADER + "make()\nprint('MODULE-RAN', __name__)\n")
    log = tmp_path / "log.jsonl"
    proc = run_command([sys.executable, "-m", "autosafe_torch", "run", "--log-file", str(log),
                        "--mode", "fix", "-m", "mymod"], tmp_path,
                       clean_env({"PYTHONPATH": str(tmp_path)}), 120)
    assert proc.returncode == 0 and "MODULE-RAN __main__" in proc.stdout, proc.stderr
    assert json.loads(log.read_text().splitlines()[0])["code"] == "DL101"
    proc = run_command([sys.executable, "-m", "autosafe_torch", "run", "--disable", "DL101",
                        "-m", "mymod"], tmp_path, clean_env({"PYTHONPATH": str(tmp_path)}), 120)
    assert proc.returncode != 0 and DL101_ERROR in proc.stderr


def test_console_script_and_doctor():
    # the console script installed beside this interpreter, not whichever is first on PATH
    script = os.path.join(sysconfig.get_path("scripts"), "autosafe-torch")
    proc = subprocess.run([script, "doctor", "--json"], capture_output=True, text=True,
                          env=clean_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    for key in ("python", "torch", "start_method", "cpus_usable", "dev_shm_bytes",
                "open_file_limit", "accelerator", "default_loader_rules"):
        assert key in report
    # DL105 fires where torch warns of pin_memory without an accelerator (the
    # children see none): not on torch 2.0, whose DataLoader does not warn
    assert any(r.startswith("DL105") for r in report["default_loader_rules"]) \
        == pin_memory_warns(), report
    text = run_command([sys.executable, "-m", "autosafe_torch", "doctor"], os.getcwd(),
                       clean_env(), 120).stdout
    assert "start_method:" in text and "cpus_usable:" in text


def test_rules_command_lists_every_rule():
    from autosafe_torch.rules import load_all

    proc = run_command([sys.executable, "-m", "autosafe_torch", "rules", "--format", "json"],
                       os.getcwd(), clean_env(), 60)
    listed = {r["code"] for r in json.loads(proc.stdout)}
    assert listed == set(load_all())


def test_sitecustomize_template_keeps_the_users_own(tmp_path):
    """The template activates, then runs the next sitecustomize on sys.path
    (here the platform simulator's, which forces spawn)."""
    body = ("import multiprocessing, sys\n"
            "print('METHOD', multiprocessing.get_start_method(),"
            " sys.modules['autosafe_torch'].is_active())\n")
    result = run_script(tmp_path, body, activation="sitecustomize", start_method="spawn")
    assert "METHOD spawn True" in result.stdout, result


def test_cli_script_classes_come_back_from_spawn_workers(tmp_path):
    """multiprocessing imported at start-up (here by the platform simulator)
    aliases __mp_main__ to the __main__ of that moment; `autosafe-torch run`
    makes it the script's, as `python script.py` has it, so a batch of a class
    defined in the script comes back from a spawn worker."""
    body = """
import collections
import torch
from torch.utils.data import DataLoader, Dataset
Sample = collections.namedtuple("Sample", "x i")
class DS(Dataset):
    def __len__(self):
        return 4
    def __getitem__(self, i):
        return Sample(torch.tensor([float(i)]), i)
if __name__ == "__main__":
    digest(DataLoader(DS(), batch_size=2, num_workers=2))
"""
    plain = run_script(tmp_path, body, start_method="spawn")
    shimmed = run_script(tmp_path, body, start_method="spawn", activation="cli")
    assert plain.rc == 0 and shimmed.rc == 0, shimmed
    assert shimmed.batches == plain.batches


def test_silent_at_interpreter_shutdown(tmp_path):
    """Work of ours reached from a ``__del__`` while the interpreter finalises
    (torch's iterator shutting its workers down at exit) does nothing: no
    import (they fail then), no "Exception ignored" line after the user's own
    output."""
    body = '''
import autosafe_torch
from autosafe_torch import engine

class Late:
    def __del__(self):
        engine.fail_open(None, "late work", lambda: __import__("xml.dom.minidom"))

keep = Late()
print("done")
'''
    r = run_script(tmp_path, body)
    assert r.rc == 0 and r.stdout.strip() == "done", r
    assert "Exception ignored" not in r.stderr and "meta_path" not in r.stderr, r.stderr
