"""Configuration: every variable validated, one clear line and a default."""

import json
import sys
import textwrap

import pytest

from autosafe_torch import config
from support import logged, run_script, clean_env
import subprocess


def test_bool_words(capsys):
    for word in config.TRUE_WORDS:
        assert config.parse_bool("X", " %s " % word.upper(), False) is True
    for word in config.FALSE_WORDS:
        assert config.parse_bool("X", word, True) is False
    assert config.parse_bool("X", None, "d") == "d"
    assert capsys.readouterr().err == ""


def test_malformed_values_warn_once_and_use_default(capsys):
    assert config.parse_bool("AUTOSAFE_TORCH_QUIET", "maybe", False) is False
    assert config.parse_mode("loud") == "fix"
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2
    assert "AUTOSAFE_TORCH_QUIET='maybe'" in err[0] and "1/true/yes/on" in err[0]
    assert "AUTOSAFE_TORCH_MODE='loud'" in err[1] and "fix/warn/strict" in err[1]


def test_disable_tokens_and_groups():
    c = config.Config(disabled=config.parse_disable("dl101, Dataloader;AMP501 *"))
    assert c.disabled == {"DL101", "dataloader", "AMP501", "*"}
    c = config.Config(disabled=config.parse_disable("DL101,amp"))
    assert not c.rule_enabled("DL101", "dataloader")
    assert c.rule_enabled("DL102", "dataloader")
    assert not c.rule_enabled("AMP501", "amp")
    assert config.Config(disabled=frozenset({"*"})).rule_enabled("CV401", "cv2") is False


def test_unknown_rule_code_one_line(capsys):
    from autosafe_torch.rules import load_all

    c = config.Config(disabled=config.parse_disable("DL999,dataloader"))
    c.validate_disabled(load_all())
    c.validate_disabled(load_all())
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "DL999" in err[0] and "AUTOSAFE_TORCH_DISABLE" in err[0]


def test_groups_and_codes_are_told_apart_by_shape(capsys):
    """A rule group is any word the registry knows, a code is letters then
    digits: a new group or code needs no edit in config."""
    from autosafe_torch.rules import Rule

    assert config.parse_disable("Vision,vis701") == {"vision", "VIS701"}
    rules = {"VIS701": Rule("VIS701", "slug", "vision", summary="s", prevents="p", fix="f",
                            example=("a", "b"), versions="v")}
    c = config.Config(disabled=config.parse_disable("vision,VIS701,nogroup"))
    c.validate_disabled(rules)
    err = capsys.readouterr().err
    assert "nogroup" in err and "vision," not in err and "VIS701" not in err.split("ignored")[0]
    assert not c.rule_enabled("VIS701", "vision") and not c.rule_enabled("VIS702", "vision")


@pytest.mark.parametrize("env, expected", [
    ({"AUTOSAFE_TORCH": "maybe"}, "AUTOSAFE_TORCH='maybe' is not one of"),
    ({"AUTOSAFE_TORCH": "1", "AUTOSAFE_TORCH_MODE": "loud"}, "AUTOSAFE_TORCH_MODE='loud'"),
    ({"AUTOSAFE_TORCH": "1", "AUTOSAFE_TORCH_DEBUG": "2"}, "AUTOSAFE_TORCH_DEBUG='2'"),
    ({"AUTOSAFE_TORCH": "1", "AUTOSAFE_TORCH_QUIET": "maybe"}, "AUTOSAFE_TORCH_QUIET='maybe'"),
    ({"AUTOSAFE_TORCH": "1", "AUTOSAFE_TORCH_LOG_FILE": "/no/such/dir/log.jsonl"},
     "AUTOSAFE_TORCH_LOG_FILE='/no/such/dir/log.jsonl': its directory /no/such/dir does not"),
])
def test_bad_environment_at_interpreter_start_is_one_line(env, expected):
    """Through the installed .pth hook: no traceback, the program runs."""
    proc = subprocess.run([sys.executable, "-c", "print('ran')"], env=clean_env(env),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout == "ran\n"
    assert proc.stderr.count("\n") == 1 and expected in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_unknown_disabled_code_reported_when_torch_loads(tmp_path):
    result = run_script(tmp_path, "import torch\n", activation="env",
                        env={"AUTOSAFE_TORCH_DISABLE": "DL999"})
    assert result.rc == 0, result
    assert result.stderr.count("DL999") == 1 and "Traceback" not in result.stderr


# ---- the JSON log file: the user's configuration, never an "internal error" --

LOADER_MISTAKE = """
import torch
from torch.utils.data import DataLoader, TensorDataset
loader = DataLoader(TensorDataset(torch.arange(8.)), batch_size=2, prefetch_factor=2)
digest(loader)
"""
DL101_ERROR = "prefetch_factor option could only be specified in multiprocessing"


def _one_config_line(result, expected):
    lines = [line for line in result.stderr.splitlines() if "the JSON log is off" in line]
    assert len(lines) == 1 and expected in lines[0], result
    assert "fixes still apply" in lines[0]
    assert "internal error" not in result.stderr and "please report" not in result.stderr
    assert "Traceback" not in result.stderr, result


@pytest.mark.parametrize("where", ["missing-dir", "directory"])
def test_bad_log_file_is_one_line_and_the_fix_still_applies(tmp_path, where):
    if where == "missing-dir":  # the mistake, without autosafe_torch
        plain = run_script(tmp_path, LOADER_MISTAKE)
        assert plain.rc != 0 and DL101_ERROR in plain.stderr, plain
    path = tmp_path / "no-such-dir" / "log.jsonl" if where == "missing-dir" else tmp_path
    result = run_script(tmp_path, LOADER_MISTAKE, activation="env",
                        env={"AUTOSAFE_TORCH_LOG_FILE": str(path)})
    assert result.rc == 0 and result.batches, result
    assert logged(result.stderr, "DL101"), result
    assert "summary: fixed DL101 x1\n" in result.stderr  # it names no log that is off
    reason = "does not exist" if where == "missing-dir" else "is a directory"
    _one_config_line(result, "AUTOSAFE_TORCH_LOG_FILE=%r: " % str(path))
    assert reason in result.stderr


def test_bad_log_file_one_line_for_the_whole_run_with_spawn_workers(tmp_path):
    """Children take the default the parent took: no second line per worker."""
    body = LOADER_MISTAKE + """
digest(DataLoader(TensorDataset(torch.arange(8.)), batch_size=2, num_workers=2))
"""
    body = "if __name__ == '__main__':\n" + textwrap.indent(textwrap.dedent(body), "    ")
    result = run_script(tmp_path, body, activation="env", start_method="spawn",
                        env={"AUTOSAFE_TORCH_LOG_FILE": str(tmp_path / "nope" / "x.jsonl")})
    assert result.rc == 0, result
    _one_config_line(result, "its directory")


@pytest.mark.parametrize("variable, value", [
    ("AUTOSAFE_TORCH_HANG_TIMEOUT", "-5"), ("AUTOSAFE_TORCH_MODE", "loud"),
    ("AUTOSAFE_TORCH_QUIET", "maybe")])
def test_a_refused_setting_is_said_once_for_the_whole_run(tmp_path, variable, value):
    """As on macOS, each spawned worker reads the environment too: the default
    the training process took is written back, so no worker says it again."""
    body = """
if __name__ == "__main__":
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    digest(DataLoader(TensorDataset(torch.arange(8.)), batch_size=2, num_workers=2),
           epochs=2)
"""
    result = run_script(tmp_path, body, activation="env",
                        env={"AUTOSAFE_TORCH_AS": "macos", variable: value})
    assert result.rc == 0 and result.batches, result
    lines = [line for line in result.stderr.splitlines() if variable + "=" in line]
    assert len(lines) == 1 and repr(value) in lines[0], result


def test_bad_log_file_from_the_cli_names_the_option(tmp_path):
    result = run_script(tmp_path, LOADER_MISTAKE, activation="cli",
                        cli_args=("--log-file", str(tmp_path / "nope" / "x.jsonl")))
    assert result.rc == 0 and logged(result.stderr, "DL101"), result
    _one_config_line(result, "--log-file=")


def test_log_file_that_fails_at_the_first_write(tmp_path):
    """The directory is gone by the time of the first record: one line, log off,
    the fix applied (and the next intervention writes no second line)."""
    body = """
import os, shutil
shutil.rmtree(os.environ["LOG_DIR"])
""" + LOADER_MISTAKE + """
digest(DataLoader(TensorDataset(torch.arange(8.)), batch_size=2, persistent_workers=True))
"""
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    result = run_script(tmp_path, body, activation="env",
                        env={"AUTOSAFE_TORCH_LOG_FILE": str(log_dir / "x.jsonl"),
                             "LOG_DIR": str(log_dir)})
    assert result.rc == 0, result
    assert [r.code for r in logged(result.stderr)] == ["DL101", "DL102"], result
    lines = [line for line in result.stderr.splitlines() if "cannot write the JSON log" in line]
    assert len(lines) == 1 and "FileNotFoundError" in lines[0], result
    assert "the JSON log is off" in lines[0] and "internal error" not in result.stderr


def test_configure_refuses_words_it_does_not_know(tmp_path):
    body = """
import autosafe_torch
print(autosafe_torch.configure(quiet="maybe", debug=2))
print(autosafe_torch.configure(quiet="no", log_file=%r))
""" % str(tmp_path)
    result = run_script(tmp_path, body)
    assert result.rc == 0, result
    err = result.stderr.splitlines()
    assert len(err) == 3, result
    assert "configure(quiet=...)='maybe' is not one of" in err[0]
    assert "configure(debug=...)='2' is not one of" in err[1]
    assert "configure(log_file=...)" in err[2] and "is a directory" in err[2]
    assert "'quiet': False" in result.stdout and "'log_file': None" in result.stdout


# ---- the JSON log's launcher fields --------------------------------------------

def test_rank_fields_are_integers(tmp_path):
    log = tmp_path / "log.jsonl"
    result = run_script(tmp_path, LOADER_MISTAKE, activation="env",
                        env={"AUTOSAFE_TORCH_LOG_FILE": str(log), "RANK": "1",
                             "LOCAL_RANK": "1", "WORLD_SIZE": "2"})
    assert result.rc == 0, result
    rec = json.loads(log.read_text().splitlines()[0])
    assert (rec["rank"], rec["local_rank"], rec["world_size"]) == (1, 1, 2)
    result = run_script(tmp_path, LOADER_MISTAKE, activation="env",
                        env={"AUTOSAFE_TORCH_LOG_FILE": str(log)})
    rec = json.loads(log.read_text().splitlines()[-1])
    assert rec["rank"] is None and "local_rank" not in rec and "world_size" not in rec
