"""torchrun, 2 ranks on gloo with a DistributedSampler and DDP, healthy and
with a data file opened in the dataset's __init__, under fork and as on
macOS, launched as ``autosafe-torch run -m torch.distributed.run
--nproc-per-node 2 train.py`` (the launcher's options pass through)."""

import pytest

from runner import START_METHODS, line_of, plain_run, run, script_text, site_re

FRAMEWORK = "torch.distributed.run"
NAME = "torchrun_train.py"
MISTAKE = [
    ("        self.file = None  # opened in the process that reads\n",
     '        self.file = open(path, "rb")  # opened once, in the parent\n'),
    ('        if self.file is None:\n            self.file = open(self.path, "rb")\n', ""),
]
EXPECTED = {"fork": "DL207", "spawn": "DL201"}


def healthy(tmp_path, method):
    plain = plain_run(tmp_path, NAME, method, torchrun=True)
    assert sorted(plain.batches()) == [0, 1], plain
    return plain.batches()


@pytest.mark.parametrize("method", START_METHODS)
def test_healthy_ranks_same_batches_no_intervention(tmp_path, method):
    batches = healthy(tmp_path, method)
    shim = run(tmp_path, NAME, script_text(NAME), True, method, torchrun=True)
    assert shim.rc == 0 and shim.batches() == batches, shim
    assert shim.records == [], shim


@pytest.mark.parametrize("method", START_METHODS)
def test_file_opened_in_init_fixed_in_every_rank(tmp_path, method):
    text = script_text(NAME, MISTAKE)
    if method == "spawn":
        plain = run(tmp_path, NAME, text, False, method, torchrun=True)
        assert plain.rc != 0 and "cannot pickle '_io.BufferedReader' object" in plain.stderr
    # Under fork the plain run shares one file offset between the workers:
    # wrong samples when their reads interleave, not on every run.
    shim = run(tmp_path, NAME, text, True, method, torchrun=True)
    assert shim.rc == 0, shim
    assert shim.batches() == healthy(tmp_path, method), shim
    code = EXPECTED[method]
    records = [r for r in shim.records if r["code"] == code]
    assert shim.codes() == [code] and len(records) == 2, shim
    # Worker decisions are made when iteration starts: the user's loop.
    line = line_of(text, "for x in loader:")
    assert sorted(r["rank"] for r in records) == [0, 1]
    for r in records:
        assert r["world_size"] == 2 and r["local_rank"] == r["rank"], r
        assert r["strategy"], r
        assert site_re(tmp_path / NAME, line).match(r["call_site"]), r
