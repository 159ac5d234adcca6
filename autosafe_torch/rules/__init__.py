"""The rule registry: where each rule runs, and what a finding says.

A rule is one declaration, a stable code and slug, keyword fields that
``explain``, ``rules`` (cli.py), docs/rules.md and docs/fix.md (readme.py)
and the codemod's plan render, and the hook where its check runs::

    @rule("DL101", "prefetch-without-workers", GROUP,
          summary="what it fixes", prevents="the error it prevents",
          fix="the permanent fix", example=(fails, fixed),
          versions="the torch versions it concerns",
          rewrite=Rewrite("loader_args", "site", does, not_where),  # or None
          at="dataloader.init")
    def prefetch_without_workers(args, ctx: InitContext): ...

A check is pure: it reads ``args`` (as the hook's earlier checks left them)
and its hook's context (``CONTEXTS``, held by tests/test_registry.py), and
returns a ``Finding``, a list of them, or None; the engine applies what a
finding asks, in fix mode only. One rule may check at several hooks:
``@RULES[code].check_at(hook)``. The seams are typed (mypy): a check as
written is a ``CheckFunction``, once registered a ``Check``.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import (TYPE_CHECKING, Any, Callable, Literal, Optional, Protocol, TypeVar, Union,
                    cast, overload)

from ..inspection.mainmodule import in_notebook
from ..inspection.naming import a_or_an, brief, number_of, what_is  # noqa: F401 (the rules' names)
from ..loaderstate import Kept

if TYPE_CHECKING:
    from ..facts import Facts
    from ..inspection.failures import Failure
    from ..remedies.isolation import Usage
    from ..report import Intervention, Needed
    from .amp import AmpCall
    from ..rung import Rung

RULES: dict[str, Rule] = {}

# Modules that declare rules (the order of checks comes from ``Check.after``).
RULE_MODULES = (
    "autosafe_torch.rules.start_method",
    "autosafe_torch.rules.pickling",
    "autosafe_torch.rules.fork",
    "autosafe_torch.rules.warmstart",
    "autosafe_torch.rules.memmap",
    "autosafe_torch.rules.loader_args",
    "autosafe_torch.rules.amp",
    "autosafe_torch.rules.accel",
    "autosafe_torch.rules.resources",
    "autosafe_torch.rules.cv2",
    "autosafe_torch.rules.recovery",
)

# The seams' types, evaluated at import on Python 3.9 too: Optional and Union,
# not ``X | None``. A remedy gets the call's working arguments (None where a
# hook has none) and returns more changes to them, or None.
Remedy = Callable[[Optional[dict[str, Any]]], Optional[dict[str, Any]]]
AppliedBy = Literal["worker step", "recovery", "patch"]
Found = Union["Finding", list["Finding"], None]
# The context a check takes: ``Context``, or its hook's (``CONTEXTS``).
_C = TypeVar("_C", bound="Context")
_C_contra = TypeVar("_C_contra", bound="Context", contravariant=True)
CheckFunction = Callable[[dict[str, Any], _C], Found]


class Check(Protocol[_C_contra]):
    """A check once registered (``Rule.check_at``), with its ``rule``. The
    registry holds ``Check[Any]``: the engine gives each its hook's context."""

    __name__: str
    rule: Rule
    # The checks (by name) at the same hook whose findings or argument changes
    # this one reads: the order at a hook comes from these, never from imports.
    after: tuple[str, ...]

    def __call__(self, args: dict[str, Any], ctx: _C_contra, /) -> Found: ...


def run_order(checks: Sequence[Check[Any]]) -> list[Check[Any]]:
    """``checks`` (one hook's) in an order where each runs after the ones its
    ``after`` names there; among checks with no such tie, as given. ValueError
    for a name that is no check, or a circle."""
    known = {c.__name__ for hook in _checks.values() for c in hook}
    after = {id(c): getattr(c, "after", ()) for c in checks}  # a check put there by hand: none
    for check in checks:
        unknown = [n for n in after[id(check)] if n not in known]
        if unknown:
            raise ValueError("rule %s: %s runs after %s, not a check" % (
                check.rule.code, check.__name__, ", ".join(unknown)))
    here = {c.__name__ for c in checks}
    ordered: list[Check[Any]] = []
    waiting = list(checks)
    while waiting:  # a check at several hooks waits only for those at this one
        done = {c.__name__ for c in ordered}
        ready = next((c for c in waiting if set(after[id(c)]) & here <= done), None)
        if ready is None:
            raise ValueError("checks wait for each other: %s" % ", ".join(
                c.__name__ for c in waiting))
        waiting.remove(ready)
        ordered.append(ready)
    return ordered


class Rewrite:
    """How ``autosafe-torch fix`` rewrites a rule's records: the codemod module
    (``codemod/<module>.py``), for one line's records (``scope`` "site") or
    the whole file's ("file"); what it writes (``does``) and where it leaves
    the permanent fix as a comment instead (``not_where``)."""

    __slots__ = ("module", "scope", "does", "not_where")

    def __init__(self, module: str, scope: str, does: str, not_where: str) -> None:
        if scope not in ("site", "file"):
            raise ValueError("a rewrite's scope is 'site' or 'file', not %r" % (scope,))
        self.module, self.scope, self.does, self.not_where = module, scope, does, not_where


@dataclass(eq=False)
class Rule:
    """A rule as declared. ``notebook_fix``: a notebook's (a worker cannot
    import one); ``clause_of``: codes whose log line its finding joins as a
    clause, as it only makes their repair fast (DL209)."""

    code: str
    slug: str
    group: str
    summary: str
    prevents: str
    fix: str
    example: tuple[str, ...]
    versions: str
    rewrite: Rewrite | None = None
    notebook_fix: str | None = None
    clause_of: tuple[str, ...] = ()
    hooks: list[str] = field(default_factory=list, init=False)

    def serves(self) -> tuple[str, ...]:
        """The rules of ``clause_of`` whose rewrite makes this one unneeded."""
        return tuple(c for c in self.clause_of if c in RULES and RULES[c].rewrite)

    def as_dict(self) -> dict[str, Any]:
        return {"code": self.code, "slug": self.slug, "group": self.group,
                "summary": self.summary, "prevents": self.prevents, "fix": self.fix,
                "at": list(self.hooks)}

    def finding(self, before: dict[str, Any], changes: dict[str, Any] | None = None,
                why: str = "", strategy: str | None = None,
                kept: Kept | None = None, shown: dict[str, Any] | None = None,
                remedies: Iterable[Remedy] = (), fix: str | None = None, done: str | None = None,
                rung: Rung | None = None, needed: Needed | None = None,
                applied_by: AppliedBy | None = None) -> Finding:
        return Finding(self, before, changes, why, strategy, kept, shown, remedies, fix, done,
                       rung, needed, applied_by)

    def check_at(self, *hooks: str,
                 after: Sequence[str] = ()) -> Callable[[CheckFunction[_C]], Check[_C]]:
        """Decorator: the check runs at ``hooks``, after the checks ``after`` names."""
        def register(function: CheckFunction[_C]) -> Check[_C]:
            check = cast("Check[_C]", function)  # its ``rule`` and ``after``, set below
            for hook in hooks:
                if hook not in _checks:
                    raise ValueError("rule %s: unknown hook %r (one of %s)" % (
                        self.code, hook, ", ".join(HOOKS)))
                _checks[hook].append(check)
                if hook not in self.hooks:
                    self.hooks.append(hook)
            check.rule = self
            check.after = tuple(after)
            return check
        return register


class Finding:
    """What one rule would change, and why: ``before``, the old values (or
    what a remedy acts on); ``changes``, new argument values; ``kept``, what
    the loader keeps for its iterators; ``shown``, words only, for the
    record's ``after``; ``remedies``, run in fix mode in order, may return
    more changes; ``applied_by``: "worker step" (DL207, DL217), "recovery"
    (the ladder that resumed), "patch" (the AMP routes). ``done`` and
    ``fix``: the record's two lines (``done`` by the user's attribute path,
    else the changed arguments). ``why``, ``strategy``: details (JSON log,
    ``AUTOSAFE_TORCH_DEBUG=1``). ``rung``: the ladder's rung it puts the
    workers on (patches and recovery ask it; its words the default
    strategy). ``needed``: for a remedy the workers apply only where they
    lack what it gives: False when none needed it (no record), a
    ``report.Said`` for what they did; None: always."""

    __slots__ = ("rule", "before", "changes", "why", "strategy", "kept", "shown", "remedies",
                 "fix", "done", "rung", "needed", "applied_by")

    def __init__(self, rule: Rule, before: dict[str, Any],
                 changes: dict[str, Any] | None = None, why: str = "",
                 strategy: str | None = None, kept: Kept | None = None,
                 shown: dict[str, Any] | None = None, remedies: Iterable[Remedy] = (),
                 fix: str | None = None, done: str | None = None, rung: Rung | None = None,
                 needed: Needed | None = None, applied_by: AppliedBy | None = None) -> None:
        self.rule = rule
        self.needed = needed
        self.before = before
        self.changes = changes or {}
        self.why = why
        self.rung = rung
        self.strategy = strategy if strategy is not None or rung is None else rung.value
        self.kept = kept or Kept()
        self.shown = shown or {}
        self.remedies = tuple(remedies)
        self.applied_by = applied_by
        self.fix = fix or (rule.notebook_fix if rule.notebook_fix is not None and in_notebook()
                           else rule.fix)
        self.done = done or ", ".join("%s %s -> %s" % (name, brief(before.get(name)), brief(new))
                                      for name, new in self.changes.items()) or rule.summary

    @property
    def after(self) -> dict[str, Any]:
        return dict(self.changes, **self.kept.given(shown=True), **self.shown)

    @property
    def is_advice(self) -> bool:
        return not (self.changes or self.kept or self.remedies or self.applied_by)

    @property
    def told_by_workers(self) -> bool:
        """Whether only the workers given its remedy can tell what it did
        (``needed``; DL220): in warn and strict modes there is nothing to say."""
        return self.needed is not None and not (self.changes or self.remedies)

    def __repr__(self) -> str:
        return "Finding(%s %s -> %s)" % (self.rule.code, self.before, self.after)


@dataclass(eq=False)
class Context:
    """What a check sees besides the arguments: ``facts`` (None after the
    workers: outcome, failure, pin), ``findings`` made so far at this hook,
    and ``plans``, what its checks share (pickling, fork plans). A hook's
    subclass (``CONTEXTS``) adds what it knows; ``dataloader.pin``'s
    arguments are ``batch``, what torch could not pin, and ``error``."""

    facts: Facts | None
    findings: list[Finding] = field(default_factory=list, init=False)
    plans: dict[str, Any] = field(default_factory=dict, init=False)

    def found(self, code: str) -> bool:
        return any(f.rule.code == code for f in self.findings)


@dataclass(eq=False)
class InitContext(Context):
    """At ``dataloader.init``: ``defaults``, DataLoader's own argument defaults."""

    facts: Facts
    defaults: dict[str, Any]


@dataclass(eq=False)
class IterContext(Context):
    """At ``dataloader.iter``: ``main_guarded()``, whether the main module trains
    under ``if __name__ == "__main__":``; ``fork_failed``: the failure that
    rules fork out for this loader (a forked worker touched CUDA: seen, never
    predicted), or None."""

    facts: Facts
    main_guarded: Callable[[], bool]
    fork_failed: Failure | None = None


@dataclass(eq=False)
class AmpContext(Context):
    """At ``autocast``, ``scaler``, ``amp.*``: ``caps``, what this torch's AMP
    can do, and ``call``, the call being made."""

    facts: Facts
    caps: Any  # patches.amp.caps.TorchAmpCaps: a layer above
    call: AmpCall


@dataclass(eq=False)
class OutcomeContext(Context):
    """At ``dataloader.outcome``, as the workers exit: ``usage``, what they
    reported using; ``workers``, their count; ``said``, the iteration's records."""

    usage: Usage
    workers: int
    said: Sequence[Intervention] = ()


@dataclass(eq=False)
class FailureContext(Context):
    """At ``dataloader.failure``, once a recovery delivered: the first
    ``failure`` and its ``first_rung``; ``tried``, the rungs that failed on the
    way; ``rung``, the one that works; ``exact``, None or why the batches may differ."""

    failure: Failure
    first_rung: Rung
    rung: Rung
    tried: Sequence[tuple[Rung, Failure]] = ()
    exact: str | None = None


# Where checks run, in the order the patches call them, and the context each
# gives its checks (a check there takes it or a base: tests/test_registry.py).
CONTEXTS: dict[str, type[Context]] = {
    "dataloader.init": InitContext, "dataloader.iter": IterContext,
    "dataloader.outcome": OutcomeContext, "dataloader.failure": FailureContext,
    "dataloader.pin": Context,
    "autocast": AmpContext, "scaler": AmpContext, "amp.legacy": AmpContext,
    "amp.provided": AmpContext}
HOOKS = tuple(CONTEXTS)
_checks: dict[str, list[Check[Any]]] = {hook: [] for hook in HOOKS}  # as registered
# As they run: derived again for a registered list that changed since.
_in_order = functools.cache(run_order)


@overload
def rule(code: str, slug: str, group: str, *, at: None = None, **fields: Any) -> Rule: ...


@overload
def rule(code: str, slug: str, group: str, *, at: str | Sequence[str],
         after: Sequence[str] = (), **fields: Any) -> Callable[[CheckFunction[_C]], Check[_C]]: ...


def rule(code: str, slug: str, group: str, *, at: str | Sequence[str] | None = None,
         after: Sequence[str] = (), **fields: Any
         ) -> Rule | Callable[[CheckFunction[_C]], Check[_C]]:
    """Declare rule ``code``; with ``at``, a decorator: ``Rule.check_at``."""
    if code in RULES:
        raise ValueError("rule %s declared twice" % code)
    declared = RULES[code] = Rule(code, slug, group, **fields)
    if at is None:
        return declared
    return declared.check_at(*((at,) if isinstance(at, str) else at), after=after)


def load_all() -> dict[str, Rule]:
    for name in RULE_MODULES:
        importlib.import_module(name)
    return RULES


def checks_at(hook: str, enabled: Callable[[Rule], bool] | None = None) -> list[Check[Any]]:
    """The checks that run at ``hook``, in order; ``enabled(rule)`` filters them."""
    load_all()
    return [c for c in _in_order(tuple(_checks[hook])) if enabled is None or enabled(c.rule)]


def find_rule(name: object) -> Rule | None:
    """The rule named by its code (``DL201``, any case) or slug, else None."""
    load_all()
    wanted = str(name).strip()
    return RULES.get(wanted.upper()) or next(
        (r for r in RULES.values() if r.slug == wanted.lower()), None)
