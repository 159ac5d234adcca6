"""The rule registry is whole: every rule runs somewhere and is tested."""

import re

from autosafe_torch.rules import HOOKS, RULES, checks_at, load_all
from support import ROOT


def test_every_rule_checks_at_a_known_hook():
    load_all()
    for code, rule in RULES.items():
        assert rule.hooks, "%s is declared but checks nowhere" % code
        assert set(rule.hooks) <= set(HOOKS), code
        for hook in rule.hooks:
            assert any(c.rule is rule for c in checks_at(hook)), (code, hook)


def test_every_rule_code_is_named_by_a_test():
    """A rule without a test is not done: each code appears in some test
    module (besides this one)."""
    load_all()
    text = "\n".join(p.read_text() for p in (ROOT / "tests").rglob("*.py")
                     if p.name != "test_registry.py")
    untested = sorted(code for code in RULES if not re.search(r"\b%s\b" % code, text))
    assert not untested, "rules named by no test: %s" % ", ".join(untested)


def test_codes_and_slugs_are_unique_and_well_formed():
    load_all()
    slugs = [r.slug for r in RULES.values()]
    assert len(slugs) == len(set(slugs))
    for code, rule in RULES.items():
        assert re.fullmatch(r"[A-Z]+[0-9]+", code) and rule.code == code
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", rule.slug), rule.slug
        assert rule.summary and rule.prevents and rule.fix
