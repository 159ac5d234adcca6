"""DL219 carries a dataset's logger configuration to spawn workers, handlers
included: a handler with methods of its stream set on itself (transformers'
default handler: ``handler.flush = sys.stderr.flush``) is made again with them
bound to the worker's stream. tests/realworld's transformers Trainer found it:
as on macOS the workers' start failed with "cannot pickle '_io.TextIOWrapper'
object", where plain spawn runs."""

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
    torch.manual_seed(0)
    digest(DataLoader(Noisy(), batch_size=4, num_workers=2, collate_fn=Collate()))
"""
LINE = "collated 4 samples"


@pytest.mark.rule("DL219")
def test_a_handler_with_its_streams_methods_is_carried_to_spawn_workers(tmp_path):
    """Plain spawn runs (the worker's import of the script configures its own
    logger): the shim, which carries the configuration, runs too, with the same
    batches and each line once. It crashed at the workers' start before."""
    plain = run_script(tmp_path, LIBRARY_LOGGING, start_method="spawn")
    assert plain.rc == 0 and plain.stderr.count(LINE) == 4, plain
    log = tmp_path / "log.jsonl"
    shim = run_script(tmp_path, LIBRARY_LOGGING, activation="env",
                      env={"AUTOSAFE_TORCH_AS": "macos", "AUTOSAFE_TORCH_LOG_FILE": str(log)})
    assert shim.rc == 0 and shim.batches == plain.batches, shim
    assert shim.stderr.count(LINE) == 4, shim  # the worker's own handler replaced, not added to
    records = json_log(log)
    assert records and all(r["action"] == "fixed" for r in records), records
    assert {r["code"] for r in records} <= {"DL219", "DL209"}, records
