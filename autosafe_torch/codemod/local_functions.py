"""DL202: a lambda or local function given to workers, lifted to module level
(what it writes, and where it would not be exact:
``rules.pickling.LOCAL_FUNCTION_REWRITE``).

Spawned workers unpickle ``collate_fn`` and ``worker_init_fn`` by name, so a
lambda or a function defined inside another cannot reach them. The variables
it reads are given by ``functools.partial`` where the loader is made: exact
only where each is assigned once, before that, in the function that makes the
loader, so that the partial holds the value the closure would read.
"""

import libcst as cst
import libcst.matchers as m
from libcst import metadata as md

from .records import NotExact, REWRITTEN, per_record
from .source import LOADER_POSITIONAL, blank_lines, find_arg

PARTS = ("collate_fn", "worker_init_fn")
COMMENT = "DL202: at module level, so that spawned workers can unpickle it"


@per_record
def rewrite(source, record):
    call = source.loader_at(record.line)
    if "function" in record.before:
        raise NotExact("the function is inside the dataset")
    done = lift_loader_functions(source, call, strict=True)
    if not done:
        raise NotExact("no lambda or local function at the call")
    return REWRITTEN, "; ".join(done)


def lift_loader_functions(source, call, strict=False):
    """Descriptions of the lifts of the loader's parts. One that cannot be
    lifted: NotExact (``strict``), else (DL204) DL202's fix as a comment."""
    done = []
    for part in PARTS:
        try:
            description = _plan_part(source, call, part)
        except NotExact as exc:
            if strict:
                raise
            source.comment(call, "DL202: %s: define it at module level (%s)" % (part, exc))
            description = "%s left as a comment: %s" % (part, exc)
        if description:
            done.append(description)
    return done


def _plan_part(source, call, part):
    """A description of the planned lift, or None (nothing to lift)."""
    planned = source.notes.setdefault("DL202: planned", {})
    key = (id(call), part)
    if key in planned:
        return planned[key]
    found = find_arg(call, part, LOADER_POSITIONAL)
    value = found[1].value if found else None
    if isinstance(value, cst.Lambda):
        planned[key] = _lift_lambda(source, call, part, value)
    elif isinstance(value, cst.Name):
        assignments = source.referents(value)
        local = [a for a in assignments if isinstance(a.node, cst.FunctionDef)
                 and not isinstance(a.scope, md.GlobalScope)]
        if not local:
            return None
        if len(assignments) != 1:
            raise NotExact("%s is bound more than once" % value.value)
        planned[key] = _lift_def(source, call, part, value, local[0])
    else:
        return None
    return planned[key]


def _closure(source, call, function):
    """The local variables ``function`` reads, each assigned once before the loader is made."""
    scope = source.scope(call)
    names = {}
    for name in m.findall(function, m.Name()):
        for assignment in source.referents(name):
            if isinstance(assignment.scope, (md.GlobalScope, md.BuiltinScope)) or any(
                    a is function for a in source.ancestors(assignment.node, own=True)):
                continue  # a global, or the function's own
            if assignment.scope is not scope:
                raise NotExact("it reads %s from a function further out" % name.value)
            names[name.value] = assignment
    statement = _statement_in(source, call, scope)
    for name, assignment in sorted(names.items()):
        if len(list(scope.assignments[name])) != 1:
            raise NotExact("it reads %s, assigned more than once" % name)
        if isinstance(assignment.node, cst.Param):
            continue
        holder = source.parent(assignment.node)
        if not isinstance(holder, cst.AssignTarget):
            raise NotExact("it reads %s, which is not a plain variable" % name)
        assigned = _statement_in(source, assignment.node, scope)
        if assigned is None or statement is None or \
                source.lines(assigned)[1] >= source.lines(statement)[0]:
            raise NotExact("it reads %s, not assigned before the loader is made" % name)
    return sorted(names)


def _statement_in(source, node, scope):
    """The statement directly in the body of ``scope``'s function holding ``node``."""
    body = getattr(getattr(scope, "node", None), "body", None)
    for candidate in source.ancestors(node, own=True):
        if source.parent(candidate) is body:
            return candidate
    return None


def _lift_lambda(source, call, part, value):
    if any(p.default is not None for p in value.params.params + value.params.kwonly_params):
        raise NotExact("the lambda has default values")
    closure = _closure(source, call, value)
    name = source.free_name(part)
    if closure and value.params.star_kwarg is not None:
        raise NotExact("the lambda takes **keywords")
    body = source.code(value.body)
    function = cst.parse_statement("def %s(%s):\n    return %s\n" % (
        name, source.code(value.params).strip(), "(%s)" % body if "\n" in body else body))
    new = _lift(source, call, part, function, name, closure, cst.Name(name))
    return "%s: lambda lifted to module level as %s" % (part, source.code(new))


def _lift_def(source, call, part, value, assignment):
    function = assignment.node
    if function.decorators:
        raise NotExact("%s is decorated" % value.value)
    if m.findall(function, m.Nonlocal() | m.Global()):
        raise NotExact("%s declares nonlocal or global names" % value.value)
    if any(p.default is not None for p in m.findall(function.params, m.Param())):
        raise NotExact("%s has default values" % value.value)
    closure = _closure(source, call, function)
    if closure and any(a.node is not value for a in assignment.references):
        raise NotExact("%s is used elsewhere too" % value.value)
    if value.value in source.globals_bound():
        raise NotExact("the module has a %s of its own" % value.value)
    source.edit(function, lambda node: cst.RemovalSentinel.REMOVE)
    new = _lift(source, call, part, function, value.value, closure)
    if new is None:
        return "%s: %s lifted to module level" % (part, value.value)
    return "%s: %s lifted to module level, given as %s" % (part, value.value, source.code(new))


def _lift(source, call, part, function, name, closure, bare=None):
    """``function`` before the loader's top-level statement, the ``closure`` as
    keyword-only arguments; what the loader is given instead (a partial, ``bare``)."""
    params = function.params
    if closure:
        extra = [cst.Param(name=cst.Name(n)) for n in closure]
        star = params.star_arg if isinstance(params.star_arg, (cst.Param, cst.ParamStar)) \
            else cst.ParamStar()
        params = params.with_changes(star_arg=star,
                                     kwonly_params=list(params.kwonly_params) + extra)
    source.insert_before(call, [function.with_changes(
        params=params, leading_lines=blank_lines(2, COMMENT) + [
            line.with_changes(indent=False) for line in function.leading_lines if line.comment])])
    new = bare if not closure else cst.parse_expression("%s.partial(%s, %s)" % (
        source.module_name("functools"), name, ", ".join("%s=%s" % (n, n) for n in closure)))
    if new is not None:
        source.set_arg(call, part, new, order=40)
        source.comment(call, "DL202: %s at module level" % part)
    return new
