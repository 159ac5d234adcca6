"""Generate the documentation's tables (``SECTIONS``) from the code.

``python -m autosafe_torch.readme --write FILE...`` rewrites, in each file,
the text between the ``<!-- NAME:start -->`` and ``<!-- NAME:end -->``
markers it holds (``FILES``: which file holds which); ``--check`` exits 1
when a file disagrees with the code (a test checks the same). Every table
must be held by one of the files given.
"""

import argparse
import pathlib
import sys

from .config import OPTIONS
from .remedies.process_state import SETTINGS
from .rules import load_all


def _table(header, rows):
    return "\n".join(["| %s |" % " | ".join(header), "|%s" % ("---|" * len(header))]
                     + ["| %s |" % " | ".join(row).rstrip() for row in rows])


def rules_markdown():
    """The rule table of docs/rules.md (and ``autosafe-torch rules --format markdown``)."""
    return _table(("code", "slug", "what it fixes", "error it prevents", "permanent fix"),
                  [(r.code, r.slug, r.summary, r.prevents, r.fix)
                   for _code, r in sorted(load_all().items())])


def rewrites_markdown():
    """The rewrite table of docs/fix.md: one row per rewrite, with the rules it
    answers, and one per rule its rewrites serve."""
    rules = [r for _code, r in sorted(load_all().items())]
    grouped = {}
    for r in rules:
        if r.rewrite is not None:
            grouped.setdefault(id(r.rewrite), (r.rewrite, []))[1].append(r.code)
    rows = [(", ".join(codes), declared.does, declared.not_where)
            for declared, codes in grouped.values()]
    rows += [(r.code, "nothing once the repair it served (%s) is in the code" % ", ".join(
        r.serves()), "") for r in rules if r.serves()]
    return _table(("rule", "rewrite", "left as a comment where"), rows)


def settings_markdown():
    """The table of the library-wide settings DL220 carries (docs/how-it-decides.md)."""
    return _table(("setting", "read where the training process imported",
                   "what it changes in a worker"),
                  [(s.label, "`%s`" % s.module, s.changes) for s in SETTINGS])


def config_markdown():
    return _table(("variable", "default", "meaning (a malformed value: one warning line, "
                   "the default)"), [("`%s`" % name, default, meaning)
                                     for name, default, meaning in OPTIONS])


SECTIONS = {"rules": rules_markdown, "rewrites": rewrites_markdown, "config": config_markdown,
            "settings": settings_markdown}

# Each file with generated tables, from the repository root, and the tables it holds
# (`make readme` and tests/test_readme.py).
FILES = {"README.md": ("config",), "docs/rules.md": ("rules",), "docs/fix.md": ("rewrites",),
         "docs/how-it-decides.md": ("settings",)}


def _markers(name):
    return "<!-- %s:start -->" % name, "<!-- %s:end -->" % name


def sections_in(text):
    """The tables whose two markers the text holds."""
    return [name for name in SECTIONS if all(m in text for m in _markers(name))]


def render(text):
    """The text with every table it has markers for regenerated between them."""
    for name in sections_in(text):
        start, end = _markers(name)
        head, rest = text.split(start, 1)
        _, tail = rest.split(end, 1)
        text = "%s%s\n%s\n%s%s" % (head, start, SECTIONS[name](), end, tail)
    return text


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m autosafe_torch.readme")
    p.add_argument("paths", nargs="+", metavar="path")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true")
    mode.add_argument("--check", action="store_true")
    args = p.parse_args(argv)
    current, held = {}, set()
    for path in args.paths:
        current[path] = pathlib.Path(path).read_text(encoding="utf-8")
        names = sections_in(current[path])
        if not names:
            raise SystemExit("%s holds no table markers" % path)
        held.update(names)
    missing = [name for name in SECTIONS if name not in held]
    if missing:
        raise SystemExit("no file given holds the %s markers" % ", ".join(missing))
    stale = 0
    for path, text in current.items():
        wanted = render(text)
        if wanted != text and args.write:
            pathlib.Path(path).write_text(wanted, encoding="utf-8")
        elif wanted != text:
            print("%s is out of date: run `make readme`" % path)
            stale = 1
    return stale


if __name__ == "__main__":
    sys.exit(main())
