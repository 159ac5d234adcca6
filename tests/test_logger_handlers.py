"""DL219 carries a dataset's logger configuration to spawn workers, handlers
included: a handler with methods of its stream set on itself (transformers'
default handler: ``handler.flush = sys.stderr.flush``) is made again with them
bound to the worker's stream. tests/realworld's transformers Trainer found it:
as on macOS the workers' start failed with "cannot pickle '_io.TextIOWrapper'
object", where plain spawn runs.

Where the worker's own import configures the logger as the training process
has it (a library that sets up its logger at import), plain spawn needs
nothing, and the shim does nothing: each worker keeps its own and says so, and
no DL219 record is made. Where the program configured it further after its
imports, the workers need the carried configuration, and DL219 says fixed."""

import pytest

from support import json_log, run_script

LIBRARY_LOGGING = """
import logging, sys
import torch
from torch.utils.data import DataLoader, Dataset

library = logging.getLogger("library")  # as transformers sets up its own logger
handler = logging.StreamHandler()
handler.flush = sys.stderr.flush
library.addHandler(handler)
library.propagate = False
library.setLevel(logging.INFO)


class Collate:
    def __init__(self):
        self.logger = logging.getLogger("library.trainer")

    def __call__(self, samples):
        self.logger.info("collated %d samples", len(samples))
        return torch.stack(samples)


class Noisy(Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, i):
        return torch.tensor([float(i), torch.rand(1).item()])


if __name__ == "__main__":
    AFTER_IMPORTS
    torch.manual_seed(0)
    digest(DataLoader(Noisy(), batch_size=4, num_workers=2, collate_fn=Collate()))
"""
LINE = "collated 4 samples"


@pytest.mark.rule("DL219")
def test_a_logger_configured_at_import_is_the_workers_own_no_repair_made(tmp_path):
    """Plain spawn runs (the worker's import of the script configures its own
    logger, as transformers' does): the shim gives the same batches and each
    line once, and records nothing, since no worker needed anything. (It
    crashed at the workers' start once, then recorded a repair.)"""
    script = LIBRARY_LOGGING.replace("AFTER_IMPORTS", "pass")
    plain = run_script(tmp_path, script, start_method="spawn")
    assert plain.rc == 0 and plain.stderr.count(LINE) == 4, plain
    log = tmp_path / "log.jsonl"
    shim = run_script(tmp_path, script, activation="env",
                      env={"AUTOSAFE_TORCH_AS": "macos", "AUTOSAFE_TORCH_LOG_FILE": str(log)})
    assert shim.rc == 0 and shim.batches == plain.batches, shim
    assert shim.stderr.count(LINE) == 4, shim  # the worker's own handler, not a second one
    records = json_log(log) if log.exists() else []
    assert {r["code"] for r in records} <= {"DL209"}, records
    assert "DL219" not in shim.stderr, shim


@pytest.mark.rule("DL219")
def test_a_logger_configured_after_the_imports_is_carried_and_said(tmp_path):
    """The program sets a format in main(), after its imports: a spawned worker's
    import does not, so plain spawn writes the workers' lines without it, where
    fork writes them with it. The shim carries it: fork's lines, DL219 fixed."""
    script = LIBRARY_LOGGING.replace(
        "AFTER_IMPORTS", "handler.setFormatter(logging.Formatter('lib: %(message)s'))")
    fork = run_script(tmp_path, script, start_method="fork")
    assert fork.rc == 0 and fork.stderr.count("lib: " + LINE) == 4, fork
    plain = run_script(tmp_path, script, start_method="spawn")
    assert plain.rc == 0 and plain.stderr.count("lib: " + LINE) == 0, plain  # the hazard
    log = tmp_path / "log.jsonl"
    shim = run_script(tmp_path, script, activation="env",
                      env={"AUTOSAFE_TORCH_AS": "macos", "AUTOSAFE_TORCH_LOG_FILE": str(log)})
    assert shim.rc == 0 and shim.batches == plain.batches == fork.batches, shim
    assert shim.stderr.count("lib: " + LINE) == 4 and shim.stderr.count(LINE) == 4, shim
    records = json_log(log)
    assert [r["action"] for r in records if r["code"] == "DL219"] == ["fixed"], records


AUDITED_WITH_A_LAMBDA = """
import logging
import torch
from torch.utils.data import DataLoader, Dataset


class Audited(Dataset):
    def __init__(self, path):
        self.log = logging.getLogger("audit")
        handler = logging.FileHandler(path)
        handler.addFilter(lambda record: True)  # a callable filter (Python >= 3.2)
        self.log.addHandler(handler)
        self.log.setLevel(logging.INFO)

    def __len__(self):
        return 8

    def __getitem__(self, i):
        self.log.info("sample %d", i)
        return torch.tensor([float(i), torch.rand(1).item()])


if __name__ == "__main__":
    torch.manual_seed(0)
    digest(DataLoader(Audited("audit.log"), batch_size=2, num_workers=2))
"""


@pytest.mark.rule("DL219")
def test_a_configuration_that_does_not_pickle_is_refused_not_sent(tmp_path):
    """A lambda as a handler's filter: its configuration cannot be sent to a
    worker. The plan sees that (it pickles the configuration it would send) and
    takes the next rung; before, the workers' start failed with torch's
    traceback (AttributeError: Can't pickle local object)."""
    fork = run_script(tmp_path, AUDITED_WITH_A_LAMBDA, start_method="fork")
    assert fork.rc == 0, fork
    fork_lines = (tmp_path / "audit.log").read_text().count("sample")
    assert fork_lines == 8
    (tmp_path / "audit.log").unlink()
    log = tmp_path / "log.jsonl"
    shim = run_script(tmp_path, AUDITED_WITH_A_LAMBDA, activation="env",
                      env={"AUTOSAFE_TORCH_AS": "macos", "AUTOSAFE_TORCH_LOG_FILE": str(log)})
    assert shim.rc == 0 and shim.batches == fork.batches, shim
    assert "Traceback" not in shim.stderr, shim
    assert (tmp_path / "audit.log").read_text().count("sample") == fork_lines
    assert "DL219" not in {r["code"] for r in json_log(log)}, json_log(log)
