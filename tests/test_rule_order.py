"""The order of the checks at a hook is derived from what each declares it runs
after (``Check.after``), not from the order the rule modules are imported; and
what a check reads of the others' findings is declared."""

import inspect
import re

import pytest

from autosafe_torch import rules

rules.load_all()
HOOKS = [hook for hook, checks in rules._checks.items() if checks]
CODE = re.compile(r'"((?:DL|CV|AMP)\d{3})"')
# Checks whose finding can emulate the workers (their state says so), which a
# check that reads ``ctx.findings`` for it must wait for.
EMULATING = re.compile(r"\b(emulated_workers|fallback|away_from_fork)\(")


def name(check):
    return check.__name__


def waits_for(hook):
    """check name -> every check name at ``hook`` it runs after, directly or not."""
    here = {name(c): c for c in rules._checks[hook]}
    closure = {}

    def reach(n):
        if n not in closure:
            closure[n] = set()
            for before in here[n].after:
                if before in here:
                    closure[n] |= {before} | reach(before)
        return closure[n]

    for n in here:
        reach(n)
    return closure


def codes_read(check):
    """The rule codes whose findings ``check`` asks for (``ctx.found``): literal
    codes in its source, and tuples of codes it names from its module."""
    source = inspect.getsource(check)
    if "ctx.found" not in source:
        return set()
    codes = set(CODE.findall(source))
    for global_name in check.__code__.co_names:
        value = check.__globals__.get(global_name)
        if isinstance(value, tuple) and value and all(
                isinstance(v, str) and CODE.fullmatch('"%s"' % v) for v in value):
            codes |= set(value)
        elif isinstance(value, tuple) and value and all(hasattr(v, "code") for v in value):
            codes |= {v.code for v in value}  # a registry whose entries name their rules
    return codes - {check.rule.code}


@pytest.mark.parametrize("hook", HOOKS)
def test_each_check_runs_after_what_it_declares(hook):
    order = [name(c) for c in rules.checks_at(hook)]
    assert sorted(order) == sorted(name(c) for c in rules._checks[hook])
    for n, before in waits_for(hook).items():
        for b in before:
            assert order.index(b) < order.index(n), (hook, b, n, order)


@pytest.mark.parametrize("hook", HOOKS)
def test_the_order_does_not_come_from_the_modules(hook):
    """Registered the other way round (the modules imported in reverse), every
    declared tie holds still."""
    reversed_order = [name(c) for c in rules.run_order(list(reversed(rules._checks[hook])))]
    for n, before in waits_for(hook).items():
        for b in before:
            assert reversed_order.index(b) < reversed_order.index(n), (hook, b, n)


def test_the_declarations_change_the_order():
    """At ``dataloader.iter``, taken the other way round, the ties reorder the
    checks: the order is the declarations', not the list's."""
    checks = list(reversed(rules._checks["dataloader.iter"]))
    assert [name(c) for c in rules.run_order(checks)] != [name(c) for c in checks]


@pytest.mark.parametrize("hook", HOOKS)
def test_what_a_check_reads_of_the_others_is_declared(hook):
    """A check that asks whether a rule found something (``ctx.found``) runs
    after a check of that rule; one that reads the findings for emulated
    workers runs after every check at the hook that can emulate them."""
    waits = waits_for(hook)
    checks = rules._checks[hook]
    undeclared = []
    for check in checks:
        for code in codes_read(check):
            of_rule = [name(c) for c in checks if c.rule.code == code and c is not check]
            if of_rule and not set(of_rule) & waits[name(check)]:
                undeclared.append("%s reads %s's findings" % (name(check), code))
        if "ctx.findings" in inspect.getsource(check):
            for other in checks:
                if other is not check and EMULATING.search(inspect.getsource(other)) \
                        and name(other) not in waits[name(check)] \
                        and name(check) not in waits[name(other)]:
                    undeclared.append("%s reads whether %s emulated the workers"
                                      % (name(check), name(other)))
    assert not undeclared, "\n".join(undeclared)


def test_a_circle_or_an_unknown_name_is_an_error():
    first, second = rules._checks["dataloader.iter"][:2]

    class Renamed:
        def __init__(self, check, after):
            self.__name__, self.rule, self.after = name(check), check.rule, after

    with pytest.raises(ValueError, match="wait for each other"):
        rules.run_order([Renamed(first, (name(second),)), Renamed(second, (name(first),))])
    with pytest.raises(ValueError, match="not a check"):
        rules.run_order([Renamed(first, ("no_such_check",))])
