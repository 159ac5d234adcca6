"""The rule registry is whole: every rule runs somewhere and is tested."""

import ast
import inspect
import re
import typing

from autosafe_torch.rules import CONTEXTS, HOOKS, RULES, Context, checks_at, load_all
from support import ROOT


def test_every_rule_checks_at_a_known_hook():
    load_all()
    for code, rule in RULES.items():
        assert rule.hooks, "%s is declared but checks nowhere" % code
        assert set(rule.hooks) <= set(HOOKS), code
        for hook in rule.hooks:
            assert any(c.rule is rule for c in checks_at(hook)), (code, hook)


def test_every_check_takes_the_context_its_hooks_give():
    """A check that reads what one hook knows takes that hook's context
    (``ctx: IterContext``: mypy checks what it reads against it), so it may
    be registered only at hooks that give that context."""
    for hook in HOOKS:
        for check in checks_at(hook):
            ctx = list(inspect.signature(check).parameters)[1]
            taken = typing.get_type_hints(check).get(ctx, Context)
            assert issubclass(CONTEXTS[hook], taken), (hook, check.__name__, taken.__name__)


def proving_tests():
    """rule code -> the test functions that prove it: those marked
    ``@pytest.mark.rule("CODE", ...)`` and those named ``test_<code>_...``
    (read from the test modules' syntax trees: a code in a comment or a
    string proves nothing)."""
    found = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.FunctionDef) or not node.name.startswith("test_"):
                continue
            codes = set(re.findall(r"(?<![a-z])([a-z]+\d{3})(?=_|$)", node.name))
            codes = {c.upper() for c in codes}
            for decorator in node.decorator_list:
                if isinstance(decorator, ast.Call) and _is_rule_mark(decorator.func):
                    codes.update(a.value for a in decorator.args
                                 if isinstance(a, ast.Constant) and isinstance(a.value, str))
            for code in codes:
                found.setdefault(code, []).append("%s::%s" % (path.name, node.name))
    return found


def _is_rule_mark(func):
    return isinstance(func, ast.Attribute) and func.attr == "rule" \
        and isinstance(func.value, ast.Attribute) and func.value.attr == "mark"


def test_every_rule_has_a_test_that_proves_it():
    """A rule without a test is not done: each code has a test function marked
    with it or named after it."""
    load_all()
    proven = proving_tests()
    untested = sorted(code for code in RULES if code not in proven)
    assert not untested, "rules no test proves: %s" % ", ".join(untested)
    unknown = sorted(code for code in proven if code not in RULES and code != "DL999")
    assert not unknown, "tests marked with no such rule: %s" % ", ".join(unknown)


def test_codes_and_slugs_are_unique_and_well_formed():
    load_all()
    slugs = [r.slug for r in RULES.values()]
    assert len(slugs) == len(set(slugs))
    for code, rule in RULES.items():
        assert re.fullmatch(r"[A-Z]+[0-9]+", code) and rule.code == code
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", rule.slug), rule.slug
        assert rule.summary and rule.prevents and rule.fix
