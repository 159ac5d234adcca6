"""The README's generated tables agree with the code."""

from autosafe_torch import readme
from support import ROOT


def test_readme_tables_are_generated_from_the_registry():
    text = (ROOT / "README.md").read_text()
    assert readme.render(text) == text, "README is out of date: run `make readme`"
