"""Generate the documentation's rule and configuration tables from the code.

``python -m autosafe_torch.readme --write README.md docs/rules.md`` rewrites,
in each file, the text between the markers it holds:
``<!-- rules:start -->``/``<!-- rules:end -->`` (docs/rules.md),
``<!-- rewrites:start -->``/``<!-- rewrites:end -->`` (docs/fix.md) and
``<!-- config:start -->``/``<!-- config:end -->`` (README.md),
``<!-- settings:start -->``/``<!-- settings:end -->`` (docs/how-it-decides.md); ``--check``
exits 1 when a file disagrees with the registry (a test checks the same).
Every table must be held by one of the files given.
"""

import argparse
import sys

from .config import OPTIONS
from .remedies.process_state import SETTINGS
from .rules import RULES, load_all


def rules_markdown():
    """The rule table of docs/rules.md (and ``autosafe-torch rules --format markdown``)."""
    load_all()
    rows = ["| code | slug | what it fixes | error it prevents | permanent fix |",
            "|---|---|---|---|---|"]
    rows += ["| %s | %s | %s | %s | %s |" % (r.code, r.slug, r.summary, r.prevents, r.fix)
             for r in (RULES[code] for code in sorted(RULES))]
    return "\n".join(rows)


def rewrites_markdown():
    """The rewrite table of docs/fix.md: one row per rewrite, with the rules it
    answers, and one per rule its rewrites serve."""
    load_all()
    rows = ["| rule | rewrite | left as a comment where |", "|---|---|---|"]
    grouped = {}
    for code in sorted(RULES):
        declared = RULES[code].rewrite
        if declared is not None:
            grouped.setdefault(id(declared), (declared, []))[1].append(code)
    for declared, codes in grouped.values():
        rows.append("| %s | %s | %s |" % (", ".join(codes), declared.does, declared.not_where))
    for code in sorted(RULES):
        served = RULES[code].serves()
        if served:
            rows.append("| %s | nothing once the repair it served (%s) is in the code | |"
                        % (code, ", ".join(served)))
    return "\n".join(rows)


def settings_markdown():
    """The table of the library-wide settings DL220 carries (docs/how-it-decides.md)."""
    rows = ["| setting | read where the training process imported | what it changes in a "
            "worker |", "|---|---|---|"]
    rows += ["| %s | `%s` | %s |" % (s.label, s.module, s.changes) for s in SETTINGS]
    return "\n".join(rows)


def config_markdown():
    rows = ["| variable | default | meaning (a malformed value: one warning line, the default) |",
            "|---|---|---|"]
    rows += ["| `%s` | %s | %s |" % option for option in OPTIONS]
    return "\n".join(rows)


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
        with open(path, encoding="utf-8") as f:
            current[path] = f.read()
        names = sections_in(current[path])
        if not names:
            raise SystemExit("%s holds no table markers" % path)
        held.update(names)
    missing = [name for name in SECTIONS if name not in held]
    if missing:
        raise SystemExit("no file given holds the %s markers" % ", ".join(missing))
    stale = []
    for path, text in current.items():
        wanted = render(text)
        if wanted == text:
            continue
        if args.write:
            with open(path, "w", encoding="utf-8") as f:
                f.write(wanted)
        else:
            print("%s is out of date: run `make readme`" % path)
            stale.append(path)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
