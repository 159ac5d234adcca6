"""``autosafe-torch explain CODE``, as ``ruff rule F401``: generated from the
registry, for every rule."""

import os
import sys

import pytest

from autosafe_torch.cli import explanation as explain
from autosafe_torch.rules import RULES, find_rule, load_all
from support import clean_env, run_command

SECTIONS = ("What it fixes", "Why: what happens without it", "Example", "This fails:",
            "The permanent fix:", "Permanent fix", "autosafe-torch fix", "Torch versions",
            "Where it checks:")


def _cli(*args):
    return run_command([sys.executable, "-m", "autosafe_torch", "explain", *args], os.getcwd(),
                       clean_env(), 60)


def test_every_registered_rule_is_explained():
    load_all()
    for code, rule in RULES.items():
        before, after = rule.example
        assert before.strip() and after.strip() and before != after, code
        assert rule.versions, code
        text = explain(rule)
        assert text.startswith("%s %s\n" % (code, rule.slug)), code
        for section in SECTIONS:
            assert section in text, (code, section)
        # what the registry declares, word for word (wrapped)
        flat = " ".join(text.split())
        for field in (rule.summary, rule.prevents, rule.fix):
            assert " ".join(field.split()) in flat, (code, field)
        assert "AUTOSAFE_TORCH_DISABLE=%s" % code in text


def test_explain_from_the_command_line():
    proc = _cli("DL201")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert proc.stdout.startswith("DL201 unpicklable-dataset\n")
    assert "self.fh = open(path, 'rb')" in proc.stdout
    assert _cli("dl201").stdout == _cli("unpicklable-dataset").stdout == proc.stdout


def test_explain_says_whether_fix_rewrites_the_rule():
    """From the rule's declaration: the rewrite, what it serves, or a comment."""
    def flat(code):
        return " ".join(explain(find_rule(code)).split())

    assert "rewrites the code at the logged line: `self.f = open(path, ...)`" in flat("DL201")
    assert "rewrites nothing: once the repair it served (DL201, DL202) is in the code" \
        in flat("DL209")
    assert "does not rewrite it: it writes the permanent fix as a comment" in flat("DL104")


def test_the_codemod_plans_from_the_declarations():
    from autosafe_torch.codemod import plan

    site = dict(plan.rewrites("site"))
    assert ("DL201", "DL207") in site and ("DL101", "DL102", "DL103", "DL105", "DL107") in site
    assert [codes for codes, _ in plan.rewrites("file")] == [("DL204",), ("CV401",)]
    assert plan.serves("DL209") == ("DL201", "DL202")


def test_the_clause_and_the_notebook_fix_are_explained():
    warm = explain(find_rule("DL209"))
    assert "a clause of the line of the fix it makes fast (DL201, DL202" in " ".join(warm.split())
    assert "next to the notebook" in explain(find_rule("DL203"))


@pytest.mark.parametrize("bad", ["DL999", "nonsense", ""])
def test_an_unknown_code_is_one_clear_line(bad):
    proc = _cli(bad)
    assert proc.returncode == 2 and proc.stdout == "", proc
    assert proc.stderr == "autosafe-torch explain: no rule %r (`autosafe-torch rules` lists " \
        "them)\n" % bad
