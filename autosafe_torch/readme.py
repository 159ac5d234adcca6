"""Generate the README's rule and configuration tables from the code.

``python -m autosafe_torch.readme --write README.md`` rewrites the text
between the ``<!-- rules:start -->``/``<!-- rules:end -->`` and
``<!-- config:start -->``/``<!-- config:end -->`` markers; ``--check``
exits 1 when the README disagrees with the registry (a test runs it).
"""

import argparse
import sys

from .config import OPTIONS
from .rules import table_markdown


def config_markdown():
    rows = ["| variable | default | meaning (a malformed value: one warning line, the default) |",
            "|---|---|---|"]
    rows += ["| `%s` | %s | %s |" % option for option in OPTIONS]
    return "\n".join(rows)


SECTIONS = {"rules": table_markdown, "config": config_markdown}


def render(text):
    for name, make in SECTIONS.items():
        start, end = "<!-- %s:start -->" % name, "<!-- %s:end -->" % name
        if start not in text or end not in text:
            raise SystemExit("README lacks the %s markers" % name)
        head, rest = text.split(start, 1)
        _, tail = rest.split(end, 1)
        text = "%s%s\n%s\n%s%s" % (head, start, make(), end, tail)
    return text


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m autosafe_torch.readme")
    p.add_argument("path")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true")
    mode.add_argument("--check", action="store_true")
    args = p.parse_args(argv)
    with open(args.path, encoding="utf-8") as f:
        current = f.read()
    wanted = render(current)
    if args.write:
        with open(args.path, "w", encoding="utf-8") as f:
            f.write(wanted)
        return 0
    if wanted != current:
        print("%s is out of date: run `make readme`" % args.path)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
