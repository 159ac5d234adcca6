import pytest

from autosafe_torch import facts, report
from autosafe_torch.config import CONFIG, Config


@pytest.fixture(autouse=True)
def _isolate_in_process_state():
    """Tests that call rules or wrappers in this process start clean."""
    saved = Config()
    saved.load(CONFIG)
    report.clear()
    yield
    CONFIG.load(saved)
    facts.override(None)
    report.clear()
