"""Which rewrite answers which record of a file, and the comment where none can."""

import textwrap

from . import amp, cv2, lazy_open, loader_args, local_functions, main_guard
from .records import COVERED, NOT_EXACT, REWRITTEN, SKIPPED
from .source import Source

# Each plans for the records of one site (a line), or of the whole file.
SITE_REWRITES = ((loader_args.CODES, loader_args.rewrite), (amp.CODES, amp.rewrite),
                 (local_functions.CODES, local_functions.rewrite),
                 (lazy_open.CODES, lazy_open.rewrite))
FILE_REWRITES = ((main_guard.CODES, main_guard.rewrite), (cv2.CODES, cv2.rewrite))
# DL209 (warm worker start) serves a repair: once the repair is in the code, the
# loader pickles and needs no warm start.
SERVES = {"DL209": ("DL201", "DL202", "DL203", "DL208")}
COMMENT_WIDTH = 72


def plan(path, text, records, log=()):
    """(the Source with its edits planned, [(record, kind, text)]); ``log``: the
    records of every file (a cv2 import elsewhere serves this file's loaders)."""
    source = Source(path, text)
    source.notes["log"] = log
    outcomes = []
    rewritable = set()
    for codes, rewrite in FILE_REWRITES:
        rewritable |= set(codes)
        mine = [r for r in records if r.code in codes]
        if mine:
            outcomes += rewrite(source, mine)
    for codes, rewrite in SITE_REWRITES:
        rewritable |= set(codes)
        sites = {}
        for record in records:
            if record.code in codes:
                sites.setdefault(record.line, []).append(record)
        for site in sites.values():
            outcomes += rewrite(source, site)
    done = {(r.line, r.code) for r, kind, _ in outcomes if kind == REWRITTEN}
    for record in records:
        if record.code in rewritable:
            continue
        if any((record.line, code) in done for code in SERVES.get(record.code, ())):
            outcomes.append((record, COVERED, "it served a repair that is now in the code"))
        else:
            outcomes.append((record, NOT_EXACT, "no rewrite for %s" % record.code))
    return source, [_commented(source, *outcome) for outcome in outcomes]


def _commented(source, record, kind, text):
    """A record no rewrite answers: its permanent fix, as a comment at its line."""
    if kind != NOT_EXACT:
        return record, kind, text
    # a loader's record: where the loader is made, which is what to change
    statement = source.dataloader_at(record.line) or source.innermost_statement_at(record.line)
    if statement is None or not record.fix:
        return record, SKIPPED, "%s; no statement at this line for a comment" % text
    source.comment(statement, "\n".join(
        textwrap.wrap("%s: %s" % (record.code, record.fix), COMMENT_WIDTH)))
    return record, kind, text
