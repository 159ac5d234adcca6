"""DL204: unguarded top-level training code moved under ``if __name__ == "__main__":``
(what it writes, and where it would not be exact: ``rules.start_method``'s DL204).

Spawned workers (macOS, Windows, Linux from Python 3.14) import the script
again, where its top-level training code would start workers of its own. Under
fork the program does what it did: the definitions first, then the same code
in the same order. A loader the run took to fork (DL204's strategy) never
pickled its workers: its lambdas and local functions are lifted as DL202's
are, so that it starts under spawn too.
"""

import ast
import collections
import symtable

import libcst as cst

from . import local_functions
from .records import REWRITTEN, NotExact

COMMENT = "DL204: the training code runs only as a script, not in spawned workers"

DEFINITION, ASSIGNMENT, GUARD, CODE = "definition", "assignment", "guard", "code"


def _is_main_test(test):
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
        return False
    sides = (test.left, test.comparisons[0].comparator)
    return isinstance(test.comparisons[0].operator, cst.Equal) \
        and any(isinstance(n, cst.Name) and n.value == "__name__" for n in sides) \
        and any(isinstance(n, cst.SimpleString) and n.evaluated_value == "__main__" for n in sides)


def classify(statement, first=False):
    if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
        return DEFINITION
    if isinstance(statement, cst.If) and _is_main_test(statement.test):
        return GUARD
    if isinstance(statement, cst.SimpleStatementLine):
        kinds = set()
        for small in statement.body:
            if isinstance(small, (cst.Import, cst.ImportFrom, cst.Pass)):
                kinds.add(DEFINITION)
            elif isinstance(small, (cst.Assign, cst.AnnAssign)):
                kinds.add(ASSIGNMENT)
            elif first and isinstance(small, cst.Expr) and isinstance(
                    small.value, (cst.SimpleString, cst.ConcatenatedString)):
                kinds.add(DEFINITION)  # the docstring
            else:
                return CODE
        return ASSIGNMENT if ASSIGNMENT in kinds else DEFINITION
    if isinstance(statement, (cst.If, cst.Try)):  # try: import cv2 / except: cv2 = None
        inner = list(_blocks(statement))
        if inner and all(classify(s) in (DEFINITION, ASSIGNMENT) for s in inner):
            return DEFINITION
    return CODE


def _blocks(statement):
    parts = [statement.body] + [h.body for h in getattr(statement, "handlers", ())]
    for name in ("orelse", "finalbody"):
        part = getattr(statement, name, None)
        if part is not None:
            parts.append(part.body if isinstance(part, (cst.Else, cst.Finally)) else part)
    for part in parts:
        if isinstance(part, cst.If):
            yield part
        else:
            yield from getattr(part, "body", ())


# -- what each top-level statement binds and reads (ast, symtable) -----------------


def _names(node):
    """(the names a top-level statement binds, those it reads while it runs: not
    in the bodies of its functions)."""
    binds, reads, local = set(), set(), set()

    def visit(n, binding):  # binding: not in a class body, lambda or comprehension
        if binding and isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            binds.add(n.name)
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            for child in getattr(n, "decorator_list", []) + n.args.defaults + [
                    d for d in n.args.kw_defaults if d]:
                visit(child, False)
            return
        binding = binding and not isinstance(n, (ast.ClassDef, ast.ListComp, ast.SetComp,
                                                 ast.DictComp, ast.GeneratorExp))
        if isinstance(n, ast.comprehension):
            local.update(x.id for x in ast.walk(n.target) if isinstance(x, ast.Name))
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
            reads.add(n.id)
        elif binding and isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
            binds.add(n.id)
        elif binding and isinstance(n, (ast.Import, ast.ImportFrom)):
            binds.update((a.asname or a.name).split(".")[0] for a in n.names if a.name != "*")
        elif binding and isinstance(n, ast.ExceptHandler) and n.name:
            binds.add(n.name)
        for child in ast.iter_child_nodes(n):
            visit(child, binding)
    visit(node, True)
    return binds, reads - local


def _lazy_reads(table, owner, out):
    """Globals each function reads, by the top-level statement it is in."""
    for child in table.get_children():
        if child.get_type() == "function":
            out[owner.get(child.get_lineno())] |= {
                s.get_name() for s in child.get_symbols() if s.is_global() and s.is_referenced()}
        _lazy_reads(child, owner, out)


def analyse(source):
    """Per top-level statement: (kind, binds, eager reads, lazy reads); and
    the index of the one at each line."""
    statements = list(source.module.body)
    owner = {line: index for index, s in enumerate(statements)
             for line in range(source.lines(s)[0], source.lines(s)[1] + 1)}
    binds, eager, lazy = (collections.defaultdict(set) for _ in range(3))
    for node in ast.parse(source.text, source.path).body:
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", ())])
        bound, read = _names(node)
        binds[owner.get(first)] |= bound
        eager[owner.get(first)] |= read
    _lazy_reads(symtable.symtable(source.text, source.path, "exec"), owner, lazy)
    kinds = [classify(s, first=(i == 0)) for i, s in enumerate(statements)]
    return statements, kinds, binds, eager, lazy, owner


def rewrite(source, records):
    statements, kinds, binds, eager, lazy, owner = analyse(source)
    if GUARD in kinds:
        at = source.lines(statements[kinds.index(GUARD)])[0]
        raise NotExact("the file has a main guard (line %d): move the code that starts "
                       "workers into it" % at)
    kept = {i for i, kind in enumerate(kinds) if kind == DEFINITION}
    needed = set().union(*[eager[i] | lazy[i] for i in kept])
    grew = True
    while grew:
        grew = False
        for i, kind in enumerate(kinds):
            if kind == ASSIGNMENT and i not in kept and binds[i] & needed:
                kept.add(i)
                needed |= eager[i] | lazy[i]
                grew = True
    moved = [i for i in range(len(statements)) if i not in kept]
    if not moved:
        raise NotExact("no top-level code to move")
    moved_binds = set().union(*[binds[i] for i in moved])
    called = set().union(*[eager[i] for i in moved])
    for record in records:
        top = owner.get(record.line)
        if top is not None and top in kept and not binds[top] & called:
            raise NotExact("the loader is iterated in %s, which this file's top-level code "
                           "does not call: the guard belongs in the script that runs it"
                           % ", ".join(sorted(binds[top])))
    for i in sorted(kept):
        clash = (binds[i] | eager[i]) & moved_binds
        if clash:
            raise NotExact("line %d binds or reads %s, which the code to move binds too"
                           % (source.lines(statements[i])[0], ", ".join(sorted(clash))))
    source.guard = [statements[i] for i in moved], COMMENT
    done = 'top-level code from line %d under if __name__ == "__main__":, the ' \
        'definitions and what they read kept' % source.lines(statements[moved[0]])[0]
    out = []
    for record in records:
        call = source.dataloader_at(record.line)
        lifted = local_functions.lift_loader_functions(source, call) if call else []
        out.append((record, REWRITTEN, "; ".join([done] + lifted)))
    return out
