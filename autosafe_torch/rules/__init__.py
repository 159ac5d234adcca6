"""The rule registry: where each rule runs, and what a finding says.

A rule is declared once, with a stable code and slug, the error it prevents
and the permanent fix (``autosafe-torch rules`` and the README table are
generated from here), and with the hook where its check runs::

    @rule("DL101", "prefetch-without-workers", GROUP, summary, prevents, fix,
          at="dataloader.init")
    def prefetch_without_workers(args, ctx): ...

A check is pure: it looks at the call's arguments (``args``, as the earlier
checks of the same hook left them) and at ``ctx`` (the platform facts and
what the hook knows: defaults, capabilities, the findings so far), and
returns a ``Finding``, a list of them, or None. It changes nothing: no
reducer installed, no environment touched, no tensor moved. The engine
applies what a finding asks, in fix mode only.

One rule may check at several hooks (CV401: at the cv2 import and at every
DataLoader): ``@RULES["CV401"].check_at("dataloader.init")``.
"""

import importlib

# Where checks run, in the order the patches call them.
HOOKS = ("dataloader.init", "dataloader.iter", "dataloader.failure", "autocast", "scaler",
         "amp.legacy", "amp.provided", "cv2.import")

RULES = {}

# Modules that declare rules; within a hook, checks run in this order, then
# in their order in the module.
RULE_MODULES = (
    "autosafe_torch.rules.workers",
    "autosafe_torch.rules.warmstart",  # after the ladder: it reads its findings
    "autosafe_torch.rules.loader_args",
    "autosafe_torch.rules.amp",
    "autosafe_torch.rules.accel",
    "autosafe_torch.rules.resources",
    "autosafe_torch.rules.cv2",
    "autosafe_torch.rules.recovery",
)

_checks = {hook: [] for hook in HOOKS}


class Rule:
    __slots__ = ("code", "slug", "group", "summary", "prevents", "fix", "hooks")

    def __init__(self, code, slug, group, summary, prevents, fix):
        self.code = code
        self.slug = slug
        self.group = group
        self.summary = summary
        self.prevents = prevents
        self.fix = fix
        self.hooks = []

    def as_dict(self):
        return {"code": self.code, "slug": self.slug, "group": self.group,
                "summary": self.summary, "prevents": self.prevents, "fix": self.fix,
                "at": list(self.hooks)}

    def finding(self, before, changes=None, why="", strategy=None, state=None,
                remedies=(), fix=None):
        return Finding(self, before, changes, why, strategy, state, remedies, fix)

    def check_at(self, *hooks):
        """Decorator: ``check`` runs at ``hooks`` for this rule."""
        def register(check):
            for hook in hooks:
                if hook not in _checks:
                    raise ValueError("rule %s: unknown hook %r (one of %s)" % (
                        self.code, hook, ", ".join(HOOKS)))
                _checks[hook].append(check)
                if hook not in self.hooks:
                    self.hooks.append(hook)
            check.rule = self
            return check
        return register


class Finding:
    """What one rule would change, and why.

    ``changes``: new values of the call's arguments (``{"prefetch_factor": None}``).
    ``state``: what the runtime keeps beside the call (loader state such as
    ``batch_device`` or ``emulated_workers``; the AMP ``api`` a call is routed to).
    ``remedies``: callables ``remedy(args)`` the engine runs in fix mode, in
    order; one may return ``{argument: value}`` to change the call further
    (a dataset that was itself a tensor, moved to CPU).
    ``before``: the old values, or what a remedy acts on, for the log.
    A finding with none of the three is advice: logged, nothing changed.
    ``fix``: the permanent fix for this cause, where it is more precise than
    the rule's (a lock, not a file, made the dataset unpicklable).
    """

    __slots__ = ("rule", "before", "changes", "why", "strategy", "state", "remedies", "fix")

    def __init__(self, rule, before, changes=None, why="", strategy=None, state=None,
                 remedies=(), fix=None):
        self.rule = rule
        self.before = before
        self.changes = changes or {}
        self.why = why
        self.strategy = strategy
        self.state = state or {}
        self.remedies = tuple(remedies)
        self.fix = fix or rule.fix

    @property
    def after(self):
        """What the log shows as the new values: arguments and runtime state."""
        return dict(self.changes, **self.state)

    @property
    def is_advice(self):
        return not (self.changes or self.state or self.remedies)

    def __repr__(self):
        return "Finding(%s %s -> %s)" % (self.rule.code, self.before, self.after)


class Context:
    """What a check sees besides the arguments: ``facts``, the findings made so
    far at this hook, and what the hook adds (``defaults``, ``caps``, ``call``...)."""

    def __init__(self, facts, **known):
        self.facts = facts
        self.findings = []
        self.__dict__.update(known)

    def found(self, code):
        """Whether an earlier check at this hook made a finding for ``code``."""
        return any(f.rule.code == code for f in self.findings)


def rule(code, slug, group, summary, prevents, fix, at=None):
    """Declare rule ``code``; as a decorator, register its check at hook(s) ``at``."""
    if code in RULES:
        raise ValueError("rule %s declared twice" % code)
    declared = RULES[code] = Rule(code, slug, group, summary, prevents, fix)
    if at is None:
        return declared
    return declared.check_at(*((at,) if isinstance(at, str) else at))


def load_all():
    for name in RULE_MODULES:
        importlib.import_module(name)
    return RULES


def checks_at(hook, enabled=None):
    """The checks that run at ``hook``, in order; ``enabled(rule)`` filters them."""
    load_all()
    checks = _checks[hook]
    if enabled is None:
        return list(checks)
    return [c for c in checks if enabled(c.rule)]


def rules_in_group(group):
    load_all()
    return [r for code, r in sorted(RULES.items()) if r.group == group]


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
