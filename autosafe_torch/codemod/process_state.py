"""DL220: what main() set that the workers read, given to each worker by the
loader's ``worker_init_fn`` (what it writes, and where it would not be exact:
``rules.pickling.PROCESS_STATE_REWRITE``)::

    DataLoader(ds, num_workers=2, worker_init_fn=seed_worker)
    ->  DataLoader(ds, num_workers=2, worker_init_fn=functools.partial(
            set_main_state, {"SEED": SEED, "Spectra.mean": Spectra.mean}, seed_worker))

The dict is pickled as the workers start and set in ``globals()``: in a spawned
worker runpy's namespace, which the script's functions read, not the copy
``__mp_main__`` holds. Fork needs none of it. Values read as the dataset
arrives (``ARRIVING``) come before any ``worker_init_fn``; one set again after
the call would differ: the dict holds what was bound at the call, fork's
workers what is bound at each start.

Run again under the shim, the patched script logs DL220 again (the shim sets
the values before the dataset arrives): a call that gives the function
already is left as it is, or given the values its dict lacks.
"""

import os

import libcst as cst
import libcst.matchers as m
from libcst import metadata as md

from .records import COVERED, REWRITTEN, NotExact, per_record, split_site
from .source import (LOADER_POSITIONAL, blank_lines, find_arg, is_docstring, spaced_comma,
                     unstarred)

HELPER = "set_main_state"
MARK = "# autosafe-torch DL220"
HELPER_TEXT = '''\
def {name}(state, worker_init_fn, worker_id):  {mark}: what main() set, in each worker
    for name, value in state.items():
        owner, _, attribute = name.rpartition(".")
        if owner:
            setattr(globals()[owner], attribute, value)
        else:
            globals()[name] = value
    if worker_init_fn is not None:
        worker_init_fn(worker_id)
'''
COMMENT = "DL220: worker_init_fn sets what main() set, in each worker"
# What pickle runs as it rebuilds the dataset in a worker, before worker_init_fn
# (__getattr__: pickle looks __setstate__ up on the instance).
ARRIVING = ("__setstate__", "__getattr__", "__getattribute__")


@per_record
def rewrite(source, record):
    carried, refused = record.after.get("carried"), record.after.get("refused")
    if refused:
        raise NotExact(" ".join(str(refused[0]).split()))
    if not isinstance(carried, list) or not carried:
        raise NotExact("the record names no value carried")
    call = unstarred(source.loader_at(record.line))
    own = find_arg(call, "worker_init_fn", LOADER_POSITIONAL)
    if own is not None and own[1].keyword is None:
        raise NotExact("worker_init_fn is passed by position")
    names = list(dict.fromkeys(_exact_name(source, record, call, e) for e in carried))
    earlier = _earlier_rewrite(source, own[1].value if own else None)
    if earlier is not None:
        return _extend(source, call, earlier, names)
    planned = source.notes.setdefault("DL220: state", {})  # id(call) -> its names
    if id(call) in planned:  # another record of the same loader: one function, one dict
        state = planned[id(call)]
        state.extend(n for n in names if n not in state)
        return COVERED, "the loader's worker_init_fn sets these values already"
    state = planned[id(call)] = names
    helper = _helper(source)
    functools = source.module_name("functools")

    def partial(given):  # after DL202's edit (order 40): it wraps the function DL202 lifted
        partial = cst.parse_expression("%s.partial(%s, %s, None)" % (
            functools, helper, _dict_text(state)))
        return partial.with_changes(args=[*partial.args[:2], partial.args[2].with_changes(
            value=cst.Name("None") if given is None else given)])

    source.set_arg(call, "worker_init_fn", partial)
    source.comment(call, COMMENT)
    return REWRITTEN, "%s set in each worker by %s, %s" % (
        ", ".join(names), helper,
        "then the loader's own worker_init_fn" if own else "as its worker_init_fn")


def _dict_text(names):
    return "{%s}" % ", ".join('"%s": %s' % (n, n) for n in names)


def _exact_name(source, record, call, entry):
    """The dotted name of one carried value, where setting it in
    ``worker_init_fn`` gives the workers what the shim gave them."""
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        raise NotExact("a value the record carried has no name")
    label, name, module = entry.get("label") or entry["name"], entry["name"], entry.get("module")
    if entry.get("setting"):
        raise NotExact("%s is a library-wide setting: set it in worker_init_fn" % label)
    if module != "__main__":
        raise NotExact("%s is a value of module %s, not of this file" % (label, module))
    parts = name.split(".")
    if len(parts) > 2 or not all(p.isidentifier() for p in parts):
        raise NotExact("%s is not a global or a class attribute of this file" % label)
    if parts[0] not in source.globals_bound():
        raise NotExact("%s is not bound at module level in this file" % parts[0])
    _global_at(source, call, parts[0])
    site = split_site(entry.get("site"))
    if site is None or not _same_file(site[0], record.path):
        raise NotExact("%s is read in another file (%s)" % (label, entry.get("site")))
    _not_read_as_it_arrives(source, label, parts, site[1])
    _not_set_after(source, call, label, parts)
    return name


def _global_at(source, call, name):
    """Not a local name of the function that makes the loader, or of one around it."""
    scope = source.scope(call)
    while scope is not None and not isinstance(scope, md.GlobalScope):
        if scope.assignments[name] and (scope is source.scope(call)
                                        or not isinstance(scope, md.ClassScope)):
            raise NotExact("%s is a local name where the loader is made" % name)
        scope = scope.parent


def _same_file(name, path):
    """Whether a reading site's file is ``path`` (the record's, resolved); a
    script run by a relative path names its code by that path."""
    if os.path.isabs(name):
        return os.path.realpath(name) == path
    return path.endswith(os.sep + os.path.normpath(name))


def _not_read_as_it_arrives(source, label, parts, line):
    arriving = [f for f in source.nodes(cst.FunctionDef) if f.name.value in ARRIVING]
    around = sorted((f for f in arriving if source.lines(f)[0] <= line <= source.lines(f)[1]),
                    key=lambda f: source.lines(f)[0])  # the outermost first
    # a function that names the global, or the attribute on anything (self.mean: Spectra.mean)
    named = m.Name(parts[0]) if len(parts) == 1 else m.Attribute(attr=m.Name(parts[1]))
    readers = around + [f for f in arriving if f not in around and m.findall(f.body, named)]
    if readers:
        raise NotExact("%s is read in %s (line %d), as the dataset arrives in a worker, "
                       "before worker_init_fn" % (label, readers[0].name.value,
                                                  source.lines(readers[0])[0]))


def _bindings(source, parts):
    """The nodes that bind the value: the global's assignments (under
    ``global`` too), ``Owner.attribute = ...`` (``cls.attribute`` too)."""
    if len(parts) == 1:
        scope = source.scope(source.module)
        return [a.node for a in scope.assignments[parts[0]]] if scope is not None else []
    stored = (md.ExpressionContext.STORE, md.ExpressionContext.DEL)
    contexts = source.meta(md.ExpressionContextProvider)
    return [node for node in source.nodes(cst.Attribute)
            if contexts.get(node) in stored and node.attr.value == parts[1]
            and isinstance(node.value, cst.Name) and node.value.value in (parts[0], "cls")]


def _not_set_after(source, call, label, parts):
    """Not bound again later in the function that makes the loader, nor in a
    function named there after the call (``train(loader, before_epoch=harder)``)."""
    position = source.meta(md.PositionProvider)
    maker, end = source.enclosing(call, cst.FunctionDef), position[call].end
    span = source.lines(maker) if maker is not None else (1, len(source.text.splitlines()))
    later = {n.value for n in source.nodes(cst.Name)
             if (position[n].start.line, position[n].start.column) > (end.line, end.column)
             and position[n].start.line <= span[1]}
    for node in _bindings(source, parts):
        where = source.enclosing(node, cst.FunctionDef)
        line = position[node].start.line
        if where is maker and line > end.line:
            raise NotExact("%s is set again at line %d, after the loader is made" % (
                label, line))
        named = [f.name.value for f in source.ancestors(where or node, own=True)
                 if isinstance(f, cst.FunctionDef) and f.name.value in later]
        if where is not maker and named:
            raise NotExact("%s is set in %s (line %d), which runs after the loader is "
                           "made" % (label, named[0], line))


def _helpers(source):
    """The module-level functions an earlier rewrite added (by their MARK)."""
    def comment(function):
        return getattr(getattr(function.body, "header", None), "comment", None)
    return [s.name.value for s in source.module.body if isinstance(s, cst.FunctionDef)
            and comment(s) is not None and comment(s).value.startswith(MARK)]


def _helper(source):
    """The function's name: an earlier rewrite's, else one added once per file
    after the imports (before any use)."""
    named = _helpers(source) or [source.notes.get("DL220: helper")]
    if named[0]:
        return named[0]
    body = list(source.module.body)
    # there is one: the statement that makes the loader is not an import
    anchor = next(s for i, s in enumerate(body) if not (
        (i == 0 and is_docstring(s)) or isinstance(s, cst.SimpleStatementLine) and all(
            isinstance(small, (cst.Import, cst.ImportFrom)) for small in s.body)))
    name = source.notes["DL220: helper"] = source.free_name(HELPER)
    function = cst.parse_statement(HELPER_TEXT.format(name=name, mark=MARK))
    source.insert_before(anchor, [function.with_changes(leading_lines=blank_lines(2))])
    source.edit(anchor, _two_blank_lines, order=0)  # after a function, as PEP 8 has it
    return name


def _two_blank_lines(statement):
    lines = list(statement.leading_lines)
    blank = next((i for i, line in enumerate(lines) if line.comment is not None), len(lines))
    return statement.with_changes(leading_lines=blank_lines(max(0, 2 - blank)) + lines)


def _earlier_rewrite(source, value):
    """``(helper, the dict)`` of an earlier rewrite's ``worker_init_fn``, or None."""
    if not isinstance(value, cst.Call) or len(value.args) != 3 \
            or "functools.partial" not in source.qualified(value.func):
        return None
    helper, state = value.args[0].value, value.args[1].value
    if isinstance(helper, cst.Name) and helper.value in _helpers(source) \
            and isinstance(state, cst.Dict):
        return helper.value, state
    return None


def _extend(source, call, earlier, names):
    helper, state = earlier
    given = {e.key.evaluated_value for e in state.elements
             if isinstance(e, cst.DictElement) and isinstance(e.key, cst.SimpleString)}
    missing = [n for n in names if n not in given]
    if not missing:
        return COVERED, "worker_init_fn gives %s these values already" % helper
    added = cst.parse_expression(_dict_text(missing))

    def edit(node):
        elements = list(node.elements)
        if elements:
            elements[-1] = elements[-1].with_changes(comma=spaced_comma())
        return node.with_changes(elements=elements + list(added.elements))

    source.edit(state, edit)
    source.comment(call, COMMENT)
    return REWRITTEN, "%s added to what %s sets in each worker" % (", ".join(missing), helper)
