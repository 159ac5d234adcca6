"""What the shim writes where another user could reach it (issue 50).

Each test stands for a promise: the shim's files in shared places are made so
that no path another local user can plant is ever opened for writing.
"""

import json
import os

from support import json_log, run_script

# A dataset whose copy in a worker fails as it arrives: the worker dies while
# starting, and its traceback must reach the training process's record. Before it
# builds the loader, the script plants what another user could have planted in the
# shared temporary folder: a link named as a worker once looked for its parent's
# folder (autosafe_torch-workers-<pid>-*), to a folder of the "victim"'s.
DIES_ARRIVING = '''
import os, sys, tempfile
import torch
from torch.utils.data import DataLoader, Dataset

class Fragile(Dataset):
    def __init__(self):
        self.n = 8  # a state to set: pickle calls __setstate__ only with one
    def __len__(self):
        return self.n
    def __getitem__(self, i):
        return torch.tensor([float(i)])
    def __setstate__(self, state):
        import multiprocessing  # a worker (spawn named it), not an emulated one
        if multiprocessing.current_process().name != "MainProcess":
            raise RuntimeError("this dataset cannot arrive in a worker")
        self.__dict__.update(state)

if __name__ == "__main__":
    victim = sys.argv[1]
    os.symlink(victim, os.path.join(tempfile.gettempdir(),
                                    "autosafe_torch-workers-%d-planted" % os.getpid()))
    torch.manual_seed(0)
    digest(DataLoader(Fragile(), batch_size=2, num_workers=2))
'''


def test_a_worker_that_dies_starting_writes_only_where_its_parent_told_it(tmp_path):
    """The worker is told its parent's folder, by its path, in its preparation
    data: the planted link is never followed (the victim's folder stays empty),
    and the record still has the worker's own traceback."""
    victim = tmp_path / "victim"
    victim.mkdir()
    shared = tmp_path / "tmp"
    shared.mkdir()
    log = tmp_path / "log.jsonl"
    result = run_script(tmp_path, DIES_ARRIVING, activation="env", args=(str(victim),),
                        env={"AUTOSAFE_TORCH_AS": "macos", "TMPDIR": str(shared),
                             "AUTOSAFE_TORCH_LOG_FILE": str(log)})
    assert result.rc == 0 and result.batches, result  # emulated workers, which need no copy
    assert list(victim.iterdir()) == [], list(victim.iterdir())
    records = json_log(log)
    why = " ".join(r["why"] for r in records)
    assert "this dataset cannot arrive in a worker" in why, json.dumps(records, indent=1)
    # it wrote in the folder its parent made and told it (the record has its
    # traceback), which went at exit with everything of ours
    assert [p for p in os.listdir(shared) if not p.endswith("-planted")] == []
