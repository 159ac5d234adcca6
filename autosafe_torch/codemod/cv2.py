"""CV401: no OpenCV pool in DataLoader workers, the program's own left as it is
(what it writes: ``rules.cv2``'s CV401), as the shim does for each worker.
Never another count: a non-zero one hangs forked workers.

CV402 (workers moved away from the parent's OpenCL context) has no rewrite:
its fix is the start method, named in the comment.
"""

import libcst as cst

from .records import COVERED, REWRITTEN, NotExact

HOOK = "%s.register_at_fork(after_in_child=lambda: %s.setNumThreads(0))"
WHY = "  # autosafe-torch CV401: no OpenCV pool in forked workers (never another count)\n"
SPAWNED = ('if __name__ == "__mp_main__":  # autosafe-torch CV401: a spawned worker\n'
           "    %s.setNumThreads(0)\n")


def rewrite(source, records):
    """Every CV401 record of the file (one per loader): the calls after its first ``import cv2``."""
    body = list(source.module.body)
    at, alias = next(((i, a) for i, a in source.imports() if source.code(a.name) == "cv2"),
                     (None, None))
    if at is None:
        raise NotExact("no module-level `import cv2` in this file")
    statement, name = body[at], alias.asname.name.value if alias.asname else "cv2"
    if any(HOOK.partition(".")[2] % name in source.code(s) for s in body[at + 1:at + 4]):
        return [(r, COVERED, "the calls follow `import cv2` already") for r in records]
    os_name = source.module_name("os")
    lines = [cst.parse_statement(HOOK % (os_name, name) + WHY),
             cst.parse_statement(SPAWNED % name)]
    source.edit(statement, lambda s: cst.FlattenSentinel([s] + lines))
    return [(r, REWRITTEN, "cv2.setNumThreads(0) in every worker, after `import cv2` at "
             "line %d" % source.lines(statement)[0]) for r in records]
