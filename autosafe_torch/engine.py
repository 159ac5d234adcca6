"""From findings to action: run the checks, then fix, warn or refuse.

One place decides what the configured mode means, for every patch:
fix applies the findings and records them; warn records what would change
and applies nothing; strict raises ``UnsafeCallError`` naming the rule and
its permanent fix.
"""

from .config import CONFIG


class UnsafeCallError(RuntimeError):
    """Raised in strict mode instead of correcting a call."""

    def __init__(self, finding, call_site):
        r = finding.rule
        super().__init__("%s %s at %s: %s (%s). Permanent fix: %s. "
                         "(AUTOSAFE_TORCH_MODE=strict)" % (
                             r.code, r.slug, call_site, r.summary, finding.why, r.fix))
        self.code = r.code
        self.finding = finding


def run_checks(checks, args, *context):
    """Run enabled ``checks`` in order; each sees the previous ones' changes.

    Returns the findings and the arguments with all of them applied.
    """
    work = dict(args)
    findings = []
    for check in checks:
        r = check.rule
        if not CONFIG.rule_enabled(r.code, r.group):
            continue
        found = check(work, *context)
        if found is not None:
            findings.append(found)
            work.update(found.after)
    return findings, work


def settle(findings, call_site):
    """Record ``findings`` as the mode says; True when they are to be applied."""
    if not findings:
        return False
    if CONFIG.mode == "strict":
        raise UnsafeCallError(findings[0], call_site)
    from .report import Intervention, record

    action = "would-fix" if CONFIG.mode == "warn" else "fixed"
    for f in findings:
        r = f.rule
        if action == "fixed" and f.apply is not None:
            f.apply()
        record(Intervention(r.code, r.slug, f.before, f.after, f.why, r.fix,
                            call_site, f.strategy, action))
    return action == "fixed"


def decide_or(default, where, decide, *args):
    """``decide(*args)``, failing open: an error of ours is logged once and
    ``default`` is returned, so that the caller runs the original call
    unchanged. Strict mode's UnsafeCallError is meant for the user: it passes."""
    try:
        return decide(*args)
    except UnsafeCallError:
        raise
    except Exception as exc:
        from .report import internal_error

        internal_error(where, exc)
        return default
