"""CV401, CV402: the two calls after ``import cv2``.

The log names the import. ``cv2.setNumThreads(0)`` and
``cv2.ocl.setUseOpenCL(False)`` go right after it. Exact where the import
runs at module level: forked workers inherit the setting, and spawned ones
import the module again, and with it cv2 and the two calls. An import
inside a function is left as a comment (spawned workers would not run it).

The shim still logs CV401/CV402 at that import in a later run: it acts when
cv2 is imported, before any line of the program after the import can run.
Calls already right after the import are not added again.
"""

import libcst as cst

from .records import COVERED, NOT_EXACT, REWRITTEN

CODES = ("CV401", "CV402")
CALLS = {"CV401": ("%s.setNumThreads(0)", "no OpenCV threads in workers (fork hangs)"),
         "CV402": ("%s.ocl.setUseOpenCL(False)", "no OpenCL in this process or its workers")}


def _cv2_name(statement):
    """The name ``import cv2`` binds in this statement line, or None."""
    for small in getattr(statement, "body", ()):
        if isinstance(small, cst.Import):
            for alias in small.names:
                if isinstance(alias.name, cst.Name) and alias.name.value == "cv2":
                    return alias.asname.name.value if alias.asname else "cv2"
    return None


def rewrite(source, records):
    """All of a file's CV401/CV402 records: those at ``import cv2`` get the calls;
    those at a loader (the shim's worker_init_fn step) need nothing more once
    the calls follow a module-level import, which workers run or inherit."""
    at_import = [r for r in records if "worker_init_fn" not in r.after]
    out = []
    for line in sorted({r.line for r in at_import}):
        out += _at_import(source, [r for r in at_import if r.line == line])
    served = {r.code: r.where for r, kind, _ in out if kind in (REWRITTEN, COVERED)}
    for record in records:
        if record in at_import:
            continue
        elsewhere = [r.where for r in source.notes.get("log", ())
                     if r.code == record.code and "worker_init_fn" not in r.after]
        where = served.get(record.code) or (elsewhere[0] if elsewhere else None)
        if where is None:
            out.append((record, NOT_EXACT, "the log names no `import cv2` for the calls"))
        else:
            out.append((record, COVERED, "workers run or inherit the call after `import "
                        "cv2` at %s" % where))
    return out


def _at_import(source, records):
    statement = source.innermost_statement_at(records[0].line)
    name = _cv2_name(statement) if isinstance(statement, cst.SimpleStatementLine) else None
    if name is None:
        return [(r, NOT_EXACT, "no `import cv2` at this line") for r in records]
    if any(isinstance(a, (cst.FunctionDef, cst.Lambda)) for a in source.ancestors(statement)):
        return [(r, NOT_EXACT, "cv2 is imported in a function, which spawned workers do "
                 "not run") for r in records]
    body = list(getattr(source.parent(statement), "body", ()))
    at = next((i for i, s in enumerate(body) if s is statement), len(body))
    following = [source.code(s).strip() for s in body[at + 1:at + 5]]
    out, lines = [], []
    for record in sorted(records, key=lambda r: r.code):
        call, why = CALLS[record.code]
        call = call % name
        if any(line.startswith(call) for line in following):
            out.append((record, COVERED, "%s follows the import already" % call))
            continue
        lines.append(cst.parse_statement("%s  # autosafe-torch %s: %s\n" % (
            call, record.code, why)))
        out.append((record, REWRITTEN, "%s after the import" % call))
    if lines:
        source.edit(statement, lambda s: cst.FlattenSentinel([s] + lines))
    return out
