"""What a run's JSON log says, as the codemod needs it: one ``Record`` per
(rule, user's file, line), and which files are the user's.

The log has one object per intervention and process (workers and ranks
repeat their parent's), with the documented fields (docs/reading-the-log.md).
A call site is ``file:line``, the user's line first when a library made the
call (``train.py:42 (via lightning/...)``), the file as Python named it
(relative when the script was run by a relative path: ``_locate``).
"""

import json
import os

from ..callsite import _PACKAGE_DIR, _installed_dirs, user_part

# What became of a record, as the summary says it: NOT_EXACT, the permanent fix as
# a comment (no exact rewrite there); COVERED, another record's rewrite made it unneeded.
KINDS = REWRITTEN, NOT_EXACT, COVERED, SKIPPED = (
    "rewritten", "left as a comment", "nothing to change", "skipped")


class NotExact(Exception):
    """A rewrite would not be exact (for one record, or its whole group): why."""


def per_record(plan):
    """A rewrite of ``plan(source, record) -> (kind, text)``, each record alone."""
    def rewrite(source, records):
        out = []
        for record in records:
            try:
                out.append((record, *plan(source, record)))
            except NotExact as exc:
                out.append((record, NOT_EXACT, str(exc)))
        return out
    return rewrite


class Record:
    """One intervention at one line of one file (the first process's record)."""

    __slots__ = ("code", "path", "shown", "line", "before", "after", "fix", "time")

    def __init__(self, obj, path, shown, line):
        self.code = obj["code"]
        self.path, self.shown, self.line = path, shown, line
        self.before = obj.get("before") if isinstance(obj.get("before"), dict) else {}
        self.after = obj.get("after") if isinstance(obj.get("after"), dict) else {}
        self.fix = obj.get("fix") if isinstance(obj.get("fix"), str) else ""
        time = obj.get("time")
        self.time = time if isinstance(time, (int, float)) else None


def split_site(site):
    """``(file, line)`` of a call site's user part, or None (``<unknown>``,
    ``<import cv2>``, a site with no line)."""
    if not isinstance(site, str):
        return None
    name, sep, line = user_part(site).rpartition(":")
    if not sep or not line.isdigit() or not name or name.startswith("<"):
        return None
    return name, int(line)


def _locate(name, log_dir, cwd=None):
    """The file a record names; a relative name from the record's ``cwd``,
    here, or the log's folder."""
    recorded = [os.path.join(cwd, name)] if isinstance(cwd, str) else []
    candidates = [name] if os.path.isabs(name) else recorded + [name, os.path.join(log_dir, name)]
    return next((c for c in candidates if os.path.isfile(c)), None)


def not_ours(path, root):
    """Why ``path`` (as found) is not the user's to change from ``root``, or None:
    a library's (the standard library's) or autosafe_torch's own file, or one
    outside ``root`` (a log names any file it likes: by an absolute path, by
    ``..``, through its ``cwd`` or a link)."""
    real, top = os.path.realpath(path), os.path.realpath(root)
    parts = real.split(os.sep)
    if "site-packages" in parts or "dist-packages" in parts:
        return "a library's file"
    if real.startswith(_PACKAGE_DIR + os.sep):
        return "autosafe_torch's own file"
    if real.startswith(_installed_dirs()):
        return "a library's file"
    if os.path.commonpath([real, top]) != top:
        return "outside %s (fix changes files under the directory it runs in, or --root)" % (
            _shown(top) if top != os.path.realpath(os.curdir) else "this directory")
    return None


def read_log(path, root=os.curdir):
    """``(records, skipped)``: one record per (code, user's file under ``root``,
    line), in the log's order; the others' outcomes (where, code, SKIPPED, why)."""
    log_dir = os.path.dirname(os.path.abspath(path))
    records, unusable, seen = [], [], set()
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    for number, text in enumerate(lines, 1):
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except ValueError:
            obj = ValueError
        if not isinstance(obj, dict) or not isinstance(obj.get("code"), str):
            unusable.append(("%s:%d" % (path, number), None, SKIPPED, "not a JSON object"
                             if obj is ValueError else "not an intervention"))
            continue
        site = split_site(obj.get("call_site"))
        if site is None:
            key = (obj["code"], obj.get("call_site"))
            if key not in seen:
                seen.add(key)
                unusable.append((str(obj.get("call_site")), obj["code"], SKIPPED,
                                 "no file and line of yours"))
            continue
        name, line = site
        found = _locate(name, log_dir, obj.get("cwd"))
        key = (obj["code"], os.path.realpath(found) if found else name, line)
        if key in seen:
            continue  # a worker's or another rank's copy of the same intervention
        seen.add(key)
        reason = "no such file here" if found is None else not_ours(found, root)
        if reason:
            unusable.append(("%s:%d" % (name, line), obj["code"], SKIPPED, reason))
        else:
            records.append(Record(obj, os.path.realpath(found), _shown(found), line))
    return records, unusable


def _shown(path):
    """The path as the user would type it: relative to here where it is below."""
    relative = os.path.relpath(path)
    return path if relative.startswith(os.pardir) else relative
