import pytest

from autosafe_torch import activation, facts, report
from autosafe_torch.config import CONFIG, Config


@pytest.fixture(autouse=True)
def _isolate_in_process_state():
    """Tests that call rules or wrappers in this process start clean, and leave
    nothing behind: the configuration, the records, and the patches (a test that
    activates the shim has it taken off again, so that later tests in this
    pytest-xdist worker run unpatched)."""
    saved = Config()
    saved.load(CONFIG)
    was_active = activation.is_active()
    report.clear()
    yield
    if activation.is_active() and not was_active:
        activation.deactivate()
    CONFIG.load(saved)
    facts.override(None)
    report.clear()
