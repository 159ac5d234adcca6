"""A worker start that fails in the training process steps down the ladder.

The plan pickles what the workers are sent when it is made; a loader's later
epochs reuse it. What changed since can still fail when torch starts the
workers again, and so can a reducer of ours that meets what it was not
written for (transformers' handler did, before 7183153). torch raises from
``iter()`` then, and no worker ran. The shim must not hand that traceback to
the program: the loader goes on on emulated workers (exact), and DL216 says
so; the records of repairs that were to be sent say they did not hold.

The case: the usual lazily opened file (``self.fh = None`` until
``__getitem__``), and a program that reads a sample itself between epochs
(``ds[0]``, to look at it): the dataset in the training process now holds an
open file. Forked workers inherit it; spawned ones cannot be sent it, so
plain spawn fails at the second epoch's start, where fork runs.
"""

import pytest

from support import json_log, run_script

SCRIPT = """
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info


class Records(Dataset):
    def __init__(self, path):
        self.path, self.fh = path, None

    def __len__(self):
        return 12

    def __getitem__(self, i):
        if self.fh is None:
            self.fh = open(self.path, "rb")
        self.fh.seek(4 * i)
        value = int.from_bytes(self.fh.read(4), "little")
        info = get_worker_info()
        return torch.tensor([float(value), torch.rand(1).item(),
                             float(info.id if info else -1)])


if __name__ == "__main__":
    with open("records.bin", "wb") as f:
        for i in range(12):
            f.write((7 * i).to_bytes(4, "little"))
    torch.manual_seed(0)
    dataset = Records("records.bin")
    loader = DataLoader(dataset, batch_size=3, num_workers=2, shuffle=True)
    batches = []
    for epoch in range(2):
        batches += list(loader)
        batches.append(dataset[0])  # the program looks at a sample: the file opens here
    digest(batches)
"""
PLAIN_ERROR = "cannot pickle '_io.BufferedReader' object"


@pytest.fixture(scope="module")
def forked(tmp_path_factory):
    """The batches of the requested workers on a safe platform."""
    tmp = tmp_path_factory.mktemp("forked")
    result = run_script(tmp, SCRIPT, start_method="fork")
    assert result.rc == 0 and result.batches, result
    return result


@pytest.mark.rule("DL216")
def test_a_start_that_fails_in_the_training_process_steps_down(tmp_path, forked):
    plain = run_script(tmp_path, SCRIPT, start_method="spawn")
    assert plain.rc != 0 and PLAIN_ERROR in plain.stderr, plain
    log = tmp_path / "log.jsonl"
    shim = run_script(tmp_path, SCRIPT, activation="env",
                      env={"AUTOSAFE_TORCH_AS": "macos", "AUTOSAFE_TORCH_LOG_FILE": str(log)})
    assert shim.rc == 0 and shim.batches == forked.batches, shim
    assert "Traceback" not in shim.stderr and "Got pickle error" not in shim.stderr, shim
    records = json_log(log)
    (recovered,) = [r for r in records if r["code"] == "DL216"]
    assert recovered["action"] == "fixed" and "emulated workers" in recovered["strategy"]
    assert "could not be started" in recovered["done"], recovered
    assert PLAIN_ERROR in recovered["done"] and "ds[0]" in recovered["fix"], recovered
    assert all(r["action"] == "fixed" for r in records), records


@pytest.mark.rule("DL216")
@pytest.mark.parametrize("disabled", ["DL216", "DL201"])
def test_with_its_rule_off_torchs_error_stands(tmp_path, disabled):
    """DL216 off, or a rule that repairs what workers are sent (here DL201, the
    file's): torch's error stands, at the start as at the plan."""
    shim = run_script(tmp_path, SCRIPT, activation="env",
                      env={"AUTOSAFE_TORCH_AS": "macos", "AUTOSAFE_TORCH_DISABLE": disabled})
    assert shim.rc != 0 and PLAIN_ERROR in shim.stderr, shim


def test_control_forked_the_shim_changes_nothing(tmp_path, forked):
    log = tmp_path / "log.jsonl"
    shim = run_script(tmp_path, SCRIPT, activation="env", start_method="fork",
                      env={"AUTOSAFE_TORCH_LOG_FILE": str(log)})
    assert shim.rc == 0 and shim.batches == forked.batches, shim
    assert not log.exists() or json_log(log) == [], json_log(log)
