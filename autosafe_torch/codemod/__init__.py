"""``autosafe-torch fix``: turn what a run fixed into a patch of the user's source.

A run under the shim logs every intervention with the user's file:line
(``run --log-file LOG.jsonl`` or ``AUTOSAFE_TORCH_LOG_FILE``); this rewrites each
such line as the permanent fix says, so that the script runs without the shim,
with the batches the shim gave (``--write`` applies the diff it prints). Only
where the rewrite is exact, else a comment with the fix above the line; only the
user's files under the directory it runs in (or ``--root``): a log says where,
not what may be written (``records.not_ours``). libcst keeps every line no
rewrite touches, byte for byte. The summary goes to stderr: stdout is the patch.

A log is for the file as it ran: a file modified since is left alone (its lines
may have moved), so a second ``fix --write`` from the same log changes nothing.
"""

import difflib
import os
import sys
import traceback

from ..config import CONFIG
from .records import KINDS, NOT_EXACT, REWRITTEN, SKIPPED, read_log

INSTALL_HINT = ("autosafe-torch fix: needs libcst, to rewrite your source keeping its "
                "formatting: pip install 'autosafe-torch[fix]'")


def add_parser(subparsers):
    p = subparsers.add_parser("fix", help="turn what a run fixed into a patch of your source")
    p.add_argument("--from", dest="log", required=True, metavar="LOG.jsonl",
                   help="the JSON-lines log of a run (run --log-file, AUTOSAFE_TORCH_LOG_FILE)")
    p.add_argument("--write", action="store_true",
                   help="apply the patch (without it, print it as a unified diff)")
    p.add_argument("--root", default=os.curdir, metavar="DIR",
                   help="the only directory whose files are changed (default: this one)")
    return p


def main(args, out=None, err=None):
    out, err = out or sys.stdout, err or sys.stderr
    try:
        import libcst  # noqa: F401, PLC0415 - optional (the fix extra): tried here
    except ImportError:
        err.write(INSTALL_HINT + "\n")
        return 2
    try:
        records, outcomes = read_log(args.log, args.root)
    except FileNotFoundError:
        err.write("autosafe-torch fix: no log at %s (a run that changed nothing writes "
                  "none)\n" % args.log)
        return 2
    except OSError as exc:
        err.write("autosafe-torch fix: cannot read %s (%s)\n" % (args.log, exc.strerror or exc))
        return 2
    files = {}
    for record in records:
        files.setdefault(record.path, []).append(record)
    written = []
    for path, file_records in files.items():
        old, new, file_outcomes = fix_file(path, file_records)
        outcomes += [("%s:%d" % (r.shown, r.line), r.code, kind, text)
                     for r, kind, text in file_outcomes]
        if new == old:
            continue
        shown = file_records[0].shown
        if args.write:  # never through a link put there since it was read (O_NOFOLLOW)
            fd = os.open(path, os.O_WRONLY | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0))
            with open(fd, "w", encoding="utf-8", newline="") as f:
                f.write(new)
            written.append(shown)
        else:
            lines = difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                         "a/" + shown, "b/" + shown)
            out.write("".join(line if line.endswith("\n") else line + "\n\\ No newline at end "
                              "of file\n" for line in lines))
    out.flush()
    _summary(err, outcomes, written, args.write)
    return 0


def fix_file(path, records):
    """(the file's text, its new text, [(record, kind, text)]) for the records of
    one file; (None, None, all skipped) where it changed since the run, cannot
    be read or parsed, or an error of ours occurs."""
    times = [r.time for r in records if r.time is not None]
    if times and os.path.getmtime(path) > min(times):
        return None, None, [(r, SKIPPED, "the file changed since the run; run it again "
                             "and fix from the new log") for r in records]
    from .plan import plan  # noqa: PLC0415 - libcst, optional (the fix extra)

    try:
        with open(path, encoding="utf-8", newline="") as f:
            text = f.read()
        source, outcomes = plan(path, text, records)
        return text, source.apply(), outcomes
    except Exception as exc:
        if CONFIG.debug:
            traceback.print_exc()
        why = (str(exc).strip().splitlines() or [""])[0]
        return None, None, [(r, SKIPPED, "not rewritten (%s: %s)" % (type(exc).__name__, why))
                            for r in records]


def _summary(err, outcomes, written, write):
    def key(outcome):
        name, _, line = outcome[0].rpartition(":")
        return (name, int(line) if line.isdigit() else 0, outcome[1] or "")

    counts = dict.fromkeys(KINDS, 0)
    for where, code, kind, text in sorted(outcomes, key=key):
        counts[kind] += 1
        err.write("%s: %s %s: %s\n" % (where, code or "-", kind, text))
    done = ", ".join("%d %s" % (counts[k], k) for k in KINDS if counts[k])
    if written:
        tail = "wrote %s" % ", ".join(written)
    elif write or not any(counts[k] for k in (REWRITTEN, NOT_EXACT)):
        tail = "nothing to write"
    else:
        tail = "--write applies it"
    err.write("autosafe-torch fix: %s; %s\n" % (done or "no interventions in the log", tail))
