"""The documentation's generated tables agree with the code."""

import pytest

from autosafe_torch import readme
from support import ROOT


@pytest.mark.parametrize("path", sorted(readme.FILES))
def test_tables_are_generated_from_the_registry(path):
    text = (ROOT / path).read_text()
    assert readme.sections_in(text) == list(
        name for name in readme.SECTIONS if name in readme.FILES[path]), path
    assert readme.render(text) == text, "%s is out of date: run `make readme`" % path


def test_every_table_is_held_by_one_file():
    held = [name for names in readme.FILES.values() for name in names]
    assert sorted(held) == sorted(readme.SECTIONS)


def test_check_and_write_on_every_file(tmp_path):
    paths = []
    for path in readme.FILES:
        copy = tmp_path / path.replace("/", "_")
        copy.write_text((ROOT / path).read_text())
        paths.append(str(copy))
    assert readme.main(paths + ["--check"]) == 0
    stale = (ROOT / "docs/rules.md").read_text().replace("| DL101 |", "| DL1O1 |")
    (tmp_path / "docs_rules.md").write_text(stale)
    assert readme.main(paths + ["--check"]) == 1
    assert readme.main(paths + ["--write"]) == 0
    assert readme.main(paths + ["--check"]) == 0
