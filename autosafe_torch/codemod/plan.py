"""Which rewrite answers which record of a file, and the comment where none can."""

import importlib
import textwrap

from .. import rules
from .records import COVERED, NOT_EXACT, REWRITTEN, SKIPPED, NotExact
from .source import Source

# The order the rewrites plan in: the file's shape first (the main guard, the
# cv2 import), then each line's calls.
ORDER = ("main_guard", "cv2", "loader_args", "amp", "local_functions", "lazy_open",
         "process_state")


def rewrites(scope):
    """``[(codes, rewrite)]`` of ``scope`` ("site" or "file"), from the rules'
    declarations (``Rule.rewrite``): which codemod module answers which codes."""
    rules.load_all()
    codes = {}
    for code, rule in sorted(rules.RULES.items()):
        if rule.rewrite is not None and rule.rewrite.scope == scope:
            codes.setdefault(rule.rewrite.module, []).append(code)
    return [(tuple(codes[m]), importlib.import_module("%s.%s" % (__package__, m)).rewrite)
            for m in sorted(codes, key=ORDER.index)]


def serves(code):
    """The codes whose rewrite makes ``code``'s fix unneeded (DL209: the repairs
    it makes fast)."""
    return rules.RULES[code].serves() if code in rules.RULES else ()


COMMENT_WIDTH = 72


def plan(path, text, records):
    """(the Source with its edits planned, [(record, kind, text)])."""
    source = Source(path, text)
    outcomes = []
    rewritable = set()
    for scope in ("file", "site"):  # a file rewrite answers all its records, a site's one line's
        for codes, rewrite in rewrites(scope):
            rewritable |= set(codes)
            groups = {}
            for record in records:
                if record.code in codes:
                    groups.setdefault(record.line if scope == "site" else 0, []).append(record)
            for group in groups.values():
                try:
                    outcomes += rewrite(source, group)
                except NotExact as exc:  # the whole group left as a comment
                    outcomes += [(r, NOT_EXACT, str(exc)) for r in group]
    done = {(r.line, r.code) for r, kind, _ in outcomes if kind == REWRITTEN}
    for record in records:
        if record.code in rewritable:
            continue
        if any((record.line, code) in done for code in serves(record.code)):
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
