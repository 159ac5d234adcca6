"""One source file under rewrite: its concrete syntax tree (libcst), what is at
a line, and the edits the rewrites plan, applied in one pass.

The log's lines are those of the file as it ran, so every rewrite finds its
nodes in the tree as parsed, and only plans: an edit is a function of the
node as edited so far, keyed by the node as parsed, so that several edits of
one call compose.
"""

import libcst as cst
import libcst.matchers as m
from libcst import metadata as md

from .records import NotExact

MAIN_GUARD = '__name__ == "__main__"'
DATALOADER = frozenset(("torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"))
# DataLoader's parameters that may be given by position (torch 1.7 to 2.13).
LOADER_POSITIONAL = ("dataset", "batch_size", "shuffle", "sampler", "batch_sampler",
                     "num_workers", "collate_fn", "pin_memory", "drop_last", "timeout",
                     "worker_init_fn", "multiprocessing_context", "generator")
COMMENT_PREFIX = "autosafe-torch "


def keyword_arg(name, value, comma=cst.MaybeSentinel.DEFAULT):
    return cst.Arg(keyword=cst.Name(name), value=value, comma=comma,
                   equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                         whitespace_after=cst.SimpleWhitespace("")))


def spaced_comma():
    return cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))


def string(text):
    return cst.SimpleString('"%s"' % text)


ATOMS = (cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.Integer, cst.Float,
         cst.Imaginary, cst.SimpleString, cst.ConcatenatedString, cst.FormattedString,
         cst.List, cst.Tuple, cst.Dict, cst.Set)


def atom(node):
    """``node``, parenthesized unless it binds at least as tightly as a comparison."""
    if node.lpar or isinstance(node, ATOMS):
        return node
    return node.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


def simple(node):
    """Whether evaluating ``node`` twice gives the same value and does nothing
    else: a name, attribute, literal or constant subscript of those."""
    if isinstance(node, (cst.Name, cst.Integer, cst.Float, cst.SimpleString)):
        return True
    if isinstance(node, cst.Attribute):
        return simple(node.value)
    if isinstance(node, cst.Subscript):
        return simple(node.value) and all(
            isinstance(e.slice, cst.Index) and simple(e.slice.value) for e in node.slice)
    if isinstance(node, cst.UnaryOperation):
        return simple(node.expression)
    return False


def blank_lines(count, comment=None):
    """``count`` blank lines at module level, then ``# autosafe-torch <comment>``."""
    comments = [cst.Comment("# " + COMMENT_PREFIX + comment)] if comment else []
    return [cst.EmptyLine(indent=False, comment=c) for c in [None] * count + comments]


def both(left, right):
    return cst.BooleanOperation(left=atom(left), operator=cst.And(), right=atom(right))


# -- arguments of a call ----------------------------------------------------------


def has_star(call):
    return any(arg.star for arg in call.args)


def unstarred(call):
    if has_star(call):
        raise NotExact("the call passes arguments by * or **")
    return call


def find_arg(call, name, positional=()):
    """``(index, Arg)`` of the argument ``name`` (a keyword, or the position it has
    in ``positional``), or None."""
    position = 0
    for index, arg in enumerate(call.args):
        if arg.star:
            return None
        if arg.keyword is not None:
            if arg.keyword.value == name:
                return index, arg
            continue
        if position < len(positional) and positional[position] == name:
            return index, arg
        position += 1
    return None


def append_arg(call, arg):
    """``call`` with ``arg`` last, laid out as the others are (a call with one
    argument per line keeps one per line, and its trailing comma)."""
    args = list(call.args)
    if not args:
        return call.with_changes(args=[arg])
    last = args[-1]
    separator = spaced_comma()
    if len(args) >= 2 and isinstance(args[-2].comma, cst.Comma):
        separator = args[-2].comma
    if isinstance(last.comma, cst.Comma):  # a trailing comma: the new one ends as it did
        arg = arg.with_changes(comma=last.comma)
    args[-1] = last.with_changes(comma=separator)
    return call.with_changes(args=args + [arg])


def remove_arg(call, index):
    args = list(call.args)
    removed = args.pop(index)
    if index == len(args) and args:  # it was last: the one before ends as it did
        args[-1] = args[-1].with_changes(comma=removed.comma)
    return call.with_changes(args=args)


def keywords_for(call, names):
    """``call`` with its positional arguments given by keyword (``names`` in their
    order), or None when they do not bind (a ``*args``, more positions than names)."""
    if has_star(call):
        return None
    args, position = [], 0
    for arg in call.args:
        if arg.keyword is None:
            if position >= len(names):
                return None
            arg = keyword_arg(names[position], arg.value, comma=arg.comma)
            position += 1
        args.append(arg)
    return call.with_changes(args=args)


# -- the file -----------------------------------------------------------------------


class Source:
    def __init__(self, path, text):
        self.path, self.text = path, text
        self.wrapper = md.MetadataWrapper(cst.parse_module(text))
        self.module = self.wrapper.module
        self._nodes = {}      # kind -> its nodes
        self._edits = {}      # id(node as parsed) -> [(order, function of the node)]
        self._comments = {}   # id(statement or decorator) -> [comment text]
        self._before = {}     # id(top-level statement) -> [statements to put before it]
        self.guard = (), None  # (top-level statements to move under a main guard, comment)
        self._imports = []    # modules to import at module level
        self._top = {id(s) for s in self.module.body}
        self.notes = {}       # what a rewrite remembers across the sites of this file

    def meta(self, provider):
        return self.wrapper.resolve(provider)  # computed once, then kept

    def lines(self, node):
        position = self.meta(md.PositionProvider)[node]
        return position.start.line, position.end.line

    def parent(self, node):
        return self.meta(md.ParentNodeProvider).get(node)

    def ancestors(self, node, own=False):
        """The nodes holding ``node``, innermost first (``own``: ``node`` first)."""
        if own:
            yield node
        node = self.parent(node)
        while node is not None:
            yield node
            node = self.parent(node)

    def scope(self, node):
        return self.meta(md.ScopeProvider).get(node)

    def qualified(self, node):
        names = self.meta(md.QualifiedNameProvider).get(node)
        if callable(names):  # libcst computes some lazily, on the first call
            names = names()
        return {q.name for q in names} if names is not None else set()

    def code(self, node):
        return self.module.code_for_node(node)

    def nodes(self, kind):
        if kind not in self._nodes:
            self._nodes[kind] = [n for n in self.meta(md.PositionProvider)
                                 if isinstance(n, kind)]
        return self._nodes[kind]

    def at(self, line, kinds):
        """The nodes of ``kinds`` spanning ``line``, innermost first."""
        spans = sorted(((self.lines(n), n) for n in self.nodes(kinds)),
                       key=lambda t: (t[0][1] - t[0][0], t[0][0]))
        return [n for (start, end), n in spans if start <= line <= end]

    def calls_at(self, line, names):
        """Calls spanning ``line`` to one of the qualified ``names``, innermost first."""
        return [call for call in self.at(line, cst.Call) if self.qualified(call.func) & names]

    def enclosing(self, node, kinds, own=False):
        return next((n for n in self.ancestors(node, own) if isinstance(n, kinds)), None)

    def statement_of(self, node):
        """The statement (or decorator) holding ``node``: where a comment goes."""
        return self.enclosing(node, (cst.Decorator, cst.SimpleStatementLine,
                                     cst.BaseCompoundStatement), own=True)

    def innermost_statement_at(self, line):
        return next(iter(self.at(line, (cst.SimpleStatementLine, cst.BaseCompoundStatement))),
                    None)

    def referents(self, name):
        """The assignments in this file a Name node reads (a builtin has none)."""
        scope = self.scope(name)
        accesses = scope.accesses[name.value] if scope is not None else ()
        return {a for access in accesses if access.node is name
                for a in access.referents if hasattr(a, "node")}

    def assigned_value(self, assignment):
        """The value of ``name = value`` for an assignment of a plain name, or None."""
        target = self.parent(assignment.node)
        statement = self.parent(target) if isinstance(target, cst.AssignTarget) else None
        if isinstance(statement, cst.Assign) and len(statement.targets) == 1:
            return statement.value
        return None

    def dataloader_at(self, line):
        """The ``DataLoader(...)`` call made at ``line``, or the one iterated there
        (the call of the one assignment of a name the line reads), or None."""
        calls = self.calls_at(line, DATALOADER)
        if calls:
            return calls[0]
        statement = self.innermost_statement_at(line)
        header = {cst.For: "iter", cst.While: "test", cst.If: "test", cst.With: "items"}
        region = getattr(statement, header.get(type(statement), ""), statement)
        if region is None:
            return None
        regions = region if isinstance(region, (list, tuple)) else [region]
        found = []
        for name in (n for part in regions for n in m.findall(part, m.Name())):
            for assignment in self.referents(name):
                value = self.assigned_value(assignment)
                if isinstance(value, cst.Call) and self.qualified(value.func) & DATALOADER \
                        and value not in found:
                    found.append(value)
        return found[0] if len(found) == 1 else None

    def loader_at(self, line):
        call = self.dataloader_at(line)
        if call is None:
            raise NotExact("no DataLoader(...) made or iterated at this line")
        return call

    def imports(self):
        """``(index, alias)`` of each name a top-level ``import`` statement imports."""
        for index, statement in enumerate(self.module.body):
            for small in statement.body if isinstance(statement, cst.SimpleStatementLine) else ():
                if isinstance(small, cst.Import):
                    yield from ((index, alias) for alias in small.names)

    def module_name(self, module):
        """A name this file can use for ``module`` at module level: the one its
        top-level ``import module`` (``import module.sub``, ``import module as
        x``) binds, else ``module``, of an ``import module`` the pass will add."""
        for _, alias in self.imports():
            dotted = self.code(alias.name)
            if alias.asname is None and dotted.split(".")[0] == module:
                return module
            if alias.asname is not None and dotted == module:
                return alias.asname.name.value
        if module not in self._imports:
            self._imports.append(module)
        return module

    def globals_bound(self):
        scope = self.scope(self.module)
        return {a.name for a in scope.assignments} if scope is not None else set()

    def free_name(self, wanted):
        """``wanted``, or ``wanted_2``...: a name no scope of the file uses, nor
        given out before."""
        given = self.notes.setdefault("names given out", set())
        used = set(given)
        for scope in set(self.meta(md.ScopeProvider).values()):
            if scope is not None:
                used |= {a.name for a in scope.assignments}
                used |= {a.node.value for a in scope.accesses if isinstance(a.node, cst.Name)}
        name, n = wanted, 1
        while name in used:
            n += 1
            name = "%s_%d" % (wanted, n)
        given.add(name)
        return name

    def edit(self, node, function, order=50):
        """Change ``node`` by ``function(node as edited so far)``; lower orders first."""
        self._edits.setdefault(id(node), []).append((order, function))

    def set_arg(self, call, name, value, positional=LOADER_POSITIONAL, order=50):
        """Plan ``call``'s argument ``name`` (a keyword, or its place in
        ``positional``) to be ``value``: a node, None (it goes), or a function of
        its value as edited so far (None where it is not given: then added by
        keyword)."""
        def edit(node):
            found = find_arg(node, name, positional)
            new = value(found and found[1].value) if callable(value) else value
            if found is None:
                return append_arg(node, keyword_arg(name, new)) if callable(value) else node
            if new is None:
                return remove_arg(node, found[0])
            args = list(node.args)
            args[found[0]] = found[1].with_changes(value=new)
            return node.with_changes(args=args)
        self.edit(call, edit, order)

    def comment(self, node, text):
        """Comment lines ``# autosafe-torch <text>`` (a line of ``text`` each) above
        the statement of ``node``, unless they are there already."""
        anchor = self.statement_of(node)
        if anchor is None:
            return
        first, *rest = text.split("\n")
        lines = ["# " + COMMENT_PREFIX + first] + ["#     " + line for line in rest]
        existing = [getattr(empty.comment, "value", None) for empty in anchor.leading_lines]
        planned = self._comments.get(id(anchor))
        if planned is None:  # put there after every other edit of the anchor
            planned = self._comments[id(anchor)] = []
            self.edit(anchor, lambda node: _with_comments(node, planned), order=100)
        if lines[0] not in existing and lines[0] not in planned:
            planned.extend(lines)

    def insert_before(self, node, statements):
        top = next(n for n in self.ancestors(node, own=True) if id(n) in self._top)
        self._before.setdefault(id(top), []).extend(statements)

    def apply(self):
        if not (self._edits or self._before or self.guard[0] or self._imports):
            return self.text
        module = self.module.visit(_Apply(self))
        if self._imports:
            module = _with_imports(module, self._imports)
        return module.code


def _with_imports(module, imports):
    """``module`` with an ``import m`` for each of ``imports``, where libcst's
    AddImportsVisitor puts one: with the file's imports, after its docstring
    and any ``from __future__`` import, never twice."""
    from libcst.codemod import CodemodContext  # noqa: PLC0415 - libcst.codemod costs ~0.08 s: only here
    from libcst.codemod.visitors import AddImportsVisitor  # noqa: PLC0415 - as above

    context = CodemodContext()
    for name in sorted(imports):
        AddImportsVisitor.add_needed_import(context, name)
    return AddImportsVisitor(context).transform_module(module)


def _with_comments(result, comments):
    """``result`` with comment lines above it (above the first of several)."""
    nodes = _flatten(result)
    if not comments or not nodes or not hasattr(nodes[0], "leading_lines"):
        return result
    nodes[0] = nodes[0].with_changes(leading_lines=list(nodes[0].leading_lines) + [
        cst.EmptyLine(comment=cst.Comment(text)) for text in comments])
    return cst.FlattenSentinel(nodes) if len(nodes) > 1 else nodes[0]


def _flatten(result):
    if isinstance(result, cst.FlattenSentinel):
        return list(result.nodes)
    if isinstance(result, cst.RemovalSentinel):
        return []
    return [result]


def is_docstring(statement):
    return isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1 \
        and isinstance(statement.body[0], cst.Expr) \
        and isinstance(statement.body[0].value, (cst.SimpleString, cst.ConcatenatedString))


class _Apply(cst.CSTTransformer):
    def __init__(self, source):
        super().__init__()
        self.source = source
        self.top_results = {}

    def on_leave(self, original, updated):
        source = self.source
        if isinstance(original, cst.Module):
            return self._module(original, updated)
        for _order, function in sorted(source._edits.get(id(original), ()),
                                       key=lambda e: e[0]):
            updated = function(updated)
        if id(original) in source._top:
            self.top_results[id(original)] = updated
        return updated

    def _module(self, original, updated):
        source = self.source
        moved = {id(s) for s in source.guard[0]}
        body, guard = [], []
        for statement in original.body:
            body.extend(source._before.get(id(statement), ()))
            nodes = _flatten(self.top_results.get(id(statement), statement))
            (guard if id(statement) in moved else body).extend(nodes)
        if guard:
            first = guard[0]
            guard[0] = first.with_changes(leading_lines=[
                line for line in first.leading_lines if line.comment is not None])
            body.append(cst.If(test=cst.parse_expression(MAIN_GUARD),
                               body=cst.IndentedBlock(body=guard),
                               leading_lines=blank_lines(2, source.guard[1])))
        return updated.with_changes(body=body)
