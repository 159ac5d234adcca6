"""CV401: no OpenCV pool in DataLoader workers, the program's own left as it is.

As the shim does for each worker (a worker_init_fn step, and an after-fork hook),
the rewrite calls ``cv2.setNumThreads(0)`` right after the file's module-level
``import cv2``: forked children from an ``os.register_at_fork`` hook, spawn and
forkserver workers (which import the main module again as ``__mp_main__``) from
the module itself. Never another count: a non-zero one hangs forked workers.

CV402 (workers moved away from the parent's OpenCL context) has no rewrite:
its fix is the start method, named in the comment.
"""

import libcst as cst

from .records import COVERED, REWRITTEN, NotExact

HOOK = "%s.register_at_fork(after_in_child=lambda: %s.setNumThreads(0))"
WHY = "  # autosafe-torch CV401: no OpenCV pool in forked workers (never another count)\n"
SPAWNED = ('if __name__ == "__mp_main__":  # autosafe-torch CV401: a spawned worker\n'
           "    %s.setNumThreads(0)\n")


def _cv2_name(statement):
    """The name ``import cv2`` binds in this statement line, or None."""
    for small in getattr(statement, "body", ()):
        if isinstance(small, cst.Import):
            for alias in small.names:
                if isinstance(alias.name, cst.Name) and alias.name.value == "cv2":
                    return alias.asname.name.value if alias.asname else "cv2"
    return None


def rewrite(source, records):
    """Every CV401 record of the file (one per loader) is answered by the calls
    after the file's first module-level ``import cv2``."""
    body = list(source.module.body)
    at = next((i for i, s in enumerate(body)
               if isinstance(s, cst.SimpleStatementLine) and _cv2_name(s)), None)
    if at is None:
        raise NotExact("no module-level `import cv2` in this file")
    statement, name = body[at], _cv2_name(body[at])
    if any(HOOK.partition(".")[2] % name in source.code(s) for s in body[at + 1:at + 4]):
        return [(r, COVERED, "the calls follow `import cv2` already") for r in records]
    os_name = source.module_name("os")
    lines = [cst.parse_statement(HOOK % (os_name, name) + WHY),
             cst.parse_statement(SPAWNED % name)]
    source.edit(statement, lambda s: cst.FlattenSentinel([s] + lines))
    return [(r, REWRITTEN, "cv2.setNumThreads(0) in every worker, after `import cv2` at "
             "line %d" % source.lines(statement)[0]) for r in records]
