"""DL201, DL207: a file the dataset opens in ``__init__``, opened lazily instead
(what it writes, and where it would not be exact: ``rules.pickling.LAZY_OPEN_REWRITE``).

``__init__`` keeps ``self._open_f = functools.partial(open, path, "rb")``, so
that ``open``'s arguments are evaluated there, as before. Each process opens
its own file as it first reads (its own offset: DL207 under fork), and the
dataset pickles (DL201 under spawn) even after the parent has read from it.
DL201 names the attribute (``dataset.f``); DL207 covers every file so opened.
"""

import libcst as cst
import libcst.matchers as m
from libcst import metadata as md

from .records import NotExact, REWRITTEN, per_record
from .source import (LOADER_POSITIONAL, blank_lines, find_arg, has_star, is_docstring,
                     spaced_comma)

OPEN_POSITIONAL = ("file", "mode", "buffering", "encoding", "errors", "newline", "closefd",
                   "opener")
PICKLING = ("__getstate__", "__setstate__", "__reduce__", "__reduce_ex__", "__slots__")


@per_record
def rewrite(source, record):
    dataset = find_arg(source.loader_at(record.line), "dataset", LOADER_POSITIONAL)
    cls = _dataset_class(source, dataset[1].value) if dataset else None
    if cls is None:
        raise NotExact("the dataset's class is not defined in this file")
    opened = _opened_in_init(source, cls)
    if record.code == "DL201":
        files = record.before.get("files") or [record.before.get("file", "")]
        if not any(files) and record.before.get("forwarders"):
            raise NotExact("no file to open lazily: %s forwards attributes (its fix is by hand)"
                           % ", ".join(map(str, record.before["forwarders"])))
        named = {}
        for path in map(str, files):
            parts = path.split(".")
            if len(parts) != 2 or parts[1] not in opened:
                raise NotExact("%s is not opened in %s.__init__ as self.%s = open(...)"
                               % (path or "the file", cls.name.value, parts[-1]))
            named[parts[1]] = opened[parts[1]]
        opened = named
    if not opened:
        raise NotExact("%s.__init__ opens no file as self.x = open(...)" % cls.name.value)
    _check_class(source, cls, opened)
    planned = source.notes.setdefault("lazy open", {}).setdefault(id(cls), [])
    for attribute, statement in sorted(opened.items()):
        if attribute not in planned:
            _plan_attribute(source, cls, attribute, statement, record.code, planned)
    return REWRITTEN, "; ".join("%s.%s opened lazily in __getitem__, once per process" % (
        cls.name.value, a) for a in sorted(opened))


def _dataset_class(source, value):
    """The module-level ClassDef ``value`` is an instance of."""
    if isinstance(value, cst.Name):
        values = [source.assigned_value(a) for a in source.referents(value)]
        if len(values) != 1 or values[0] is None:
            return None
        value = values[0]
    if not isinstance(value, cst.Call) or not isinstance(value.func, cst.Name):
        return None
    for assignment in source.referents(value.func):
        if isinstance(assignment.node, cst.ClassDef) \
                and isinstance(assignment.scope, md.GlobalScope):
            return assignment.node
    return None


def _methods(cls):
    return {s.name.value: s for s in cls.body.body if isinstance(s, cst.FunctionDef)}


def _self_name(function):
    params = function.params.params
    return params[0].name.value if params else None


def _opened_in_init(source, cls):
    """attribute -> the statement ``self.attribute = open(...)`` of ``__init__``."""
    init = _methods(cls).get("__init__")
    shape = m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(
        target=m.Attribute(value=m.Name(_self_name(init) if init else None)))], value=m.Call())])
    found = {}
    for statement in (init.body.body if init else ()):
        assign = statement.body[0] if m.matches(statement, shape) else None
        if assign is not None and "builtins.open" in source.qualified(assign.value.func):
            found[assign.targets[0].target.attr.value] = statement
    return found


def _check_class(source, cls, opened):
    methods = _methods(cls)
    bound = {t.target.value for s in cls.body.body if isinstance(s, cst.SimpleStatementLine)
             for a in s.body if isinstance(a, cst.Assign) for t in a.targets
             if isinstance(t.target, cst.Name)}
    for name in PICKLING:
        if name in methods or name in bound:
            raise NotExact("%s defines %s" % (cls.name.value, name))
    if "__getitem__" not in methods:
        raise NotExact("%s has no __getitem__" % cls.name.value)
    for attribute, statement in opened.items():
        open_call = statement.body[0].value
        mode = find_arg(open_call, "mode", OPEN_POSITIONAL)
        if has_star(open_call) or (mode and not (
                isinstance(mode[1].value, cst.SimpleString)
                and set(mode[1].value.evaluated_value) <= set("rbt"))):
            raise NotExact("self.%s is not opened read-only" % attribute)
        for use in m.findall(cls.body, m.Attribute(attr=m.Name(attribute))):
            method = next((a for a in source.ancestors(use) if isinstance(a, cst.FunctionDef)
                           and source.parent(source.parent(a)) is cls), None)
            where = method.name.value if method is not None else None
            if where == "__getitem__" or (where == "__init__" and
                                          use is statement.body[0].targets[0].target):
                continue
            raise NotExact("self.%s is used in %s too" % (attribute, where or cls.name.value))


def _plan_attribute(source, cls, attribute, statement, code, planned):
    os_name, functools = source.module_name("os"), source.module_name("functools")
    this = _self_name(_methods(cls)["__init__"])
    open_call = statement.body[0].value
    opener = cst.Call(func=cst.parse_expression("%s.partial" % functools),
                      args=[cst.Arg(cst.Name("open"), comma=spaced_comma())] + list(open_call.args))
    new = [cst.parse_statement("%s.%s = None\n" % (this, attribute)).with_changes(
               leading_lines=statement.leading_lines),
           cst.parse_statement("%s._%s_pid = None\n" % (this, attribute)),
           cst.SimpleStatementLine([cst.Assign(
               [cst.AssignTarget(cst.parse_expression("%s._open_%s" % (this, attribute)))],
               opener)], trailing_whitespace=statement.trailing_whitespace)]  # its comment
    source.edit(statement, lambda s: cst.FlattenSentinel(new))
    source.comment(statement, "%s: opened in __getitem__, once in each process" % code)

    getitem = _methods(cls)["__getitem__"]
    me = _self_name(getitem)
    reopen = cst.parse_statement(
        f"if {me}._{attribute}_pid != {os_name}.getpid():"
        f"  # autosafe-torch {code}: a file of its own\n"
        f"    {me}.{attribute}, {me}._{attribute}_pid = "
        f"{me}._open_{attribute}(), {os_name}.getpid()\n")

    def first_in_getitem(function):
        body = list(function.body.body)
        at = 1 if body and is_docstring(body[0]) else 0
        return function.with_changes(body=function.body.with_changes(
            body=body[:at] + [reopen] + body[at:]))
    source.edit(getitem, first_in_getitem)

    if not planned:
        source.edit(cls, lambda c: _with_getstate(c, planned, code))
    planned.append(attribute)


def _with_getstate(cls, attributes, code):
    nulls = " = ".join('state["%s"]' % n for a in attributes for n in (a, "_%s_pid" % a))
    method = cst.parse_statement(
        "def __getstate__(self):  # autosafe-torch %s: a file does not travel to a worker\n"
        "    state = dict(self.__dict__)\n"
        "    %s = None\n"
        "    return state\n" % (code, nulls)).with_changes(leading_lines=blank_lines(1))
    return cls.with_changes(body=cls.body.with_changes(body=list(cls.body.body) + [method]))
