"""Configuration: every variable validated, one clear line and a default."""

import sys

import pytest

from autosafe_torch import config
from support import run_script, clean_env
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
    rules = {"VIS701": Rule("VIS701", "slug", "vision", "s", "p", "f")}
    c = config.Config(disabled=config.parse_disable("vision,VIS701,nogroup"))
    c.validate_disabled(rules)
    err = capsys.readouterr().err
    assert "nogroup" in err and "vision," not in err and "VIS701" not in err.split("ignored")[0]
    assert not c.rule_enabled("VIS701", "vision") and not c.rule_enabled("VIS702", "vision")


@pytest.mark.parametrize("env, expected", [
    ({"AUTOSAFE_TORCH": "maybe"}, "AUTOSAFE_TORCH='maybe' is not one of"),
    ({"AUTOSAFE_TORCH": "1", "AUTOSAFE_TORCH_MODE": "loud"}, "AUTOSAFE_TORCH_MODE='loud'"),
    ({"AUTOSAFE_TORCH": "1", "AUTOSAFE_TORCH_DEBUG": "2"}, "AUTOSAFE_TORCH_DEBUG='2'"),
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
