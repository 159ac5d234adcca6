"""The rule registry.

A rule is a pure function: it looks at a call's arguments and the platform
facts and returns ``Finding`` objects that say what to change and why. It
starts no process, touches no torch worker and logs nothing; the patches
apply what it finds and the report logs it. Each rule is declared once,
with a stable code and slug, the error it prevents and the permanent fix:
``autosafe-torch rules`` and the README table are generated from here.
"""

import importlib

RULES = {}

# Modules that declare rules, in the order they are checked. Those with a
# CHECKS tuple check DataLoader(...) calls (patches/dataloader.py).
RULE_MODULES = (
    "autosafe_torch.rules.workers",
    "autosafe_torch.rules.loader_args",
    "autosafe_torch.rules.amp",
    "autosafe_torch.rules.accel",
    "autosafe_torch.rules.resources",
    "autosafe_torch.rules.cv2",
)


class Rule:
    __slots__ = ("code", "slug", "group", "summary", "prevents", "fix", "check")

    def __init__(self, code, slug, group, summary, prevents, fix, check=None):
        self.code = code
        self.slug = slug
        self.group = group
        self.summary = summary
        self.prevents = prevents
        self.fix = fix
        self.check = check

    def as_dict(self):
        return {"code": self.code, "slug": self.slug, "group": self.group,
                "summary": self.summary, "prevents": self.prevents, "fix": self.fix}

    def finding(self, before, after, why, strategy=None, apply=None):
        return Finding(self, before, after, why, strategy, apply)


class Finding:
    """What one rule would change in one call.

    ``after`` maps argument names to their new values; ``before`` holds the
    old ones (or, for a side effect, what it acts on). ``apply``, when given,
    is a side effect run only in fix mode (moving tensors off a device, say).
    """

    __slots__ = ("rule", "before", "after", "why", "strategy", "apply")

    def __init__(self, rule, before, after, why, strategy=None, apply=None):
        self.rule = rule
        self.before = before
        self.after = after
        self.why = why
        self.strategy = strategy
        self.apply = apply

    def __repr__(self):
        return "Finding(%s %s -> %s)" % (self.rule.code, self.before, self.after)


def rule(code, slug, group, summary, prevents, fix):
    """Decorator: register ``check`` as rule ``code``."""

    def register(check):
        if code in RULES:
            raise ValueError("rule %s declared twice" % code)
        RULES[code] = Rule(code, slug, group, summary, prevents, fix, check)
        check.rule = RULES[code]
        return check

    return register


def declare(code, slug, group, summary, prevents, fix):
    """Register a rule whose check lives in a patch, not in a function here."""
    RULES[code] = Rule(code, slug, group, summary, prevents, fix)
    return RULES[code]


def load_all():
    for name in RULE_MODULES:
        importlib.import_module(name)
    return RULES


def rules_in_group(group):
    load_all()
    return [r for code, r in sorted(RULES.items()) if r.group == group and r.check]


def table_markdown():
    """The README's rule table."""
    load_all()
    rows = ["| code | slug | what it fixes | error it prevents | permanent fix |",
            "|---|---|---|---|---|"]
    for code in sorted(RULES):
        r = RULES[code]
        rows.append("| %s | %s | %s | %s | %s |" % (
            r.code, r.slug, r.summary, r.prevents, r.fix))
    return "\n".join(rows)
