"""From findings to action: the one place that decides what the mode means,
for every patch. Fix applies the findings (their argument changes, then their
remedies) and records them; warn records what would change; strict raises
``UnsafeCallError`` naming the rule and its permanent fix. Advice (a finding
that changes nothing) is recorded as advice in every mode."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from .. import report, rules
from ..config import CONFIG
from ..errors import NoExactRung
from ..inspection import objwalk
from ..report import count_again

if TYPE_CHECKING:
    from ..report import Intervention
    from ..rules import Context, Finding, Rule

_T = TypeVar("_T")  # what fail_open's call returns


class UnsafeCallError(RuntimeError):
    """Raised in strict mode instead of correcting a call."""

    def __init__(self, finding: Finding, call_site: str) -> None:
        # The log's format: the user's line, what the fix would have been, the fix.
        super().__init__(intervention_of(finding, call_site, "refused").message())
        self.code = finding.rule.code
        self.finding = finding


def intervention_of(finding: Finding, call_site: str, action: str) -> Intervention:
    r = finding.rule
    made = report.Intervention(r.code, r.slug, finding.before, finding.after, finding.why,
                               finding.fix, call_site, finding.strategy, action, finding.done,
                               finding.rung)
    made.needed = finding.needed
    return made


def enabled(rule: Rule) -> bool:
    """The one place where AUTOSAFE_TORCH_DISABLE is applied, for every hook."""
    return CONFIG.rule_enabled(rule.code, rule.group)


def run_checks(hook: str, args: dict[str, Any],
               ctx: Context) -> tuple[list[Finding], dict[str, Any]]:
    """The enabled checks at ``hook``, in order, each seeing the arguments as the
    earlier ones changed them (and their findings in ``ctx.findings``): the
    findings and the changed arguments, nothing applied (``settle``)."""
    work = dict(args)
    findings = ctx.findings = []
    try:
        for check in rules.checks_at(hook, enabled):
            found = check(work, ctx)
            for finding in (found if isinstance(found, (list, tuple)) else (found,)):
                if finding is not None:
                    findings.append(finding)
                    work.update(finding.changes)
    finally:
        objwalk.forget()  # what the walks read of large containers holds for this call only
    return findings, work


def settle(findings: Sequence[Finding], call_site: str,
           args: dict[str, Any] | None = None) -> bool:
    """``settle_later``, its records made now; True when the findings were applied."""
    applied, made = settle_later(findings, call_site, args)
    for intervention in made:
        record_outcome(intervention)
    return applied


def settle_later(findings: Sequence[Finding], call_site: str,
                 args: dict[str, Any] | None = None) -> tuple[bool, list[Intervention]]:
    """Settle ``findings`` as the mode says: ``(applied, interventions)``. Fix
    mode runs the remedies, their changes merged into ``args``, and returns the
    records unmade: a record states an outcome, never a plan (``record_outcome``
    once it held). Warn and strict mode record (or raise) now."""
    fixing = CONFIG.mode == "fix"
    if not fixing:
        findings = [f for f in findings if not f.told_by_workers]
    actions = [f for f in findings if not f.is_advice]
    if actions and CONFIG.mode == "strict":
        raise UnsafeCallError(actions[0], call_site)
    made = [intervention_of(f, call_site,
                            "advised" if f.is_advice else "fixed" if fixing else "would-fix")
            for f in findings]
    # A finding that only makes an earlier one fast (DL209 after DL201) is a clause
    # of the first such one's line (``Rule.clause_of``), not a line of its own.
    for i, f in enumerate(findings):
        hosts = [made[j] for j in range(i) if findings[j].rule.code in f.rule.clause_of]
        if hosts:
            hosts[0].clauses.append(made[i])
    if not fixing:
        for intervention in made:
            report.record(intervention)
        return False, []
    for remedy in [r for f in actions for r in f.remedies]:
        changed = remedy(args)
        if changed and args is not None:
            args.update(changed)
    return bool(actions), made


def record_outcome(intervention: Intervention,
                   failed: str | None = None) -> Intervention | None:
    """Record ``intervention`` (from ``settle_later``) now that its remedy ran: as
    fixed, or as a fix that did not hold and why (``failed``). None where the
    workers needed none of it (``Finding.needed``): nothing done, nothing failed."""
    said = intervention.needed() if intervention.needed is not None else True
    if not said:
        return None
    if isinstance(said, report.Said):
        intervention.done = said.done
        intervention.after = dict(intervention.after, **said.after)
    if failed is not None:
        intervention.failed(failed)
    return report.record(intervention)


_REPEATS_LIMIT = 4096
# (findings, call site) -> (the Interventions to count again, applied)
_repeats: dict[tuple[tuple[Finding, ...], str], tuple[list[Intervention], bool]] = {}


def settle_repeated(findings: tuple[Finding, ...], call_site: str) -> bool:
    """``settle`` for a call made on every step (autocast) with findings without
    remedies (the AMP rules): after the first time at a site, fix mode counts
    the first time's records again, as ``report.record`` does."""
    if CONFIG.mode != "fix":
        return settle(findings, call_site)
    key = (findings, call_site)
    again = _repeats.get(key)
    if again is not None:  # the hot path: one lookup, one count
        count_again(again[0])
        return again[1]
    applied = settle(findings, call_site)
    if len(_repeats) < _REPEATS_LIMIT:
        known = {(i.code, i.call_site): i for i in report.interventions()}
        _repeats[key] = ([known[(f.rule.code, call_site)] for f in findings
                          if (f.rule.code, call_site) in known], applied)
    return applied


def forget_repeats() -> None:
    """After ``report.clear()``: the next call at a site is recorded anew."""
    _repeats.clear()


def fail_open(default: _T, where: str, call: Callable[..., _T], *args: Any) -> _T:
    """``call(*args)``, failing open: an error of ours is logged once and
    ``default`` returned, for the caller to run the original call unchanged;
    a refusal for the user passes (strict mode's UnsafeCallError, a rung's
    NoExactRung). Nothing of ours runs once the interpreter is finalising (a
    torch ``__del__`` at exit): imports fail."""
    if sys.is_finalizing():
        return default
    try:
        return call(*args)
    except (UnsafeCallError, NoExactRung):
        raise
    except Exception as exc:
        report.internal_error(where, exc)
        return default
