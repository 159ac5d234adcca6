"""A torch whose private DataLoader names moved (autosafe_torch/torch_private.py).

The script itself moves them, as a later torch release might, before it
builds a loader: torch's own loop is rewritten to call the new name, so
torch works; the shim's recovery and emulated workers, which call the old
names, must step aside with one line, and the loader yields torch's batches
(or torch's own error), never an AttributeError of ours.
"""


from support import logged, run_script, shim_lines
from watch_gap import acted

# torch renames _MultiProcessingDataLoaderIter._try_get_data to _try_fetch.
MOVED_TRY_GET_DATA = '''
import inspect, textwrap
from torch.utils.data import dataloader as _dl
_I = _dl._MultiProcessingDataLoaderIter
_I._try_fetch = _I._try_get_data
del _I._try_get_data
_ns = {}
exec(textwrap.dedent(inspect.getsource(_I._get_data)).replace("_try_get_data", "_try_fetch"),
     _dl.__dict__, _ns)
_I._get_data = _ns["_get_data"]
'''

# torch renames its worker module's WorkerInfo (what emulated workers build).
MOVED_WORKER_INFO = '''
from torch.utils.data._utils import worker as _w
_w.WorkerInfoV2 = _w.WorkerInfo
del _w.WorkerInfo
'''

AUGMENTED = '''
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info
{moved}
class Augmented(Dataset):
    def __len__(self):
        return 24
    def __getitem__(self, i):
        info = get_worker_info()
        return torch.tensor([float(i), float(info.id), torch.rand(()).item()])

if __name__ == "__main__":
    torch.manual_seed(0)
    digest(DataLoader(Augmented(), batch_size=4, num_workers=2), epochs=2)
'''

GENERATOR = '''
import torch
from torch.utils.data import DataLoader, Dataset
{moved}
class Streamed(Dataset):
    def __init__(self):
        self.gen = (i for i in range(10 ** 6))
    def __len__(self):
        return 8
    def __getitem__(self, i):
        return torch.tensor(float(i))

if __name__ == "__main__":
    dataset = Streamed()
    next(dataset.gen)  # advanced: no new build gives it (not built again in a worker)
    digest(DataLoader(dataset, batch_size=2, num_workers=2))
'''


def test_a_moved_iterator_method_leaves_torch_s_own_iterator(tmp_path):
    body = AUGMENTED.format(moved=MOVED_TRY_GET_DATA)
    plain = run_script(tmp_path, body, start_method="fork")
    assert plain.rc == 0 and plain.batches, plain
    shim = run_script(tmp_path, body, start_method="fork", activation="env")
    assert shim.rc == 0 and shim.batches == plain.batches, shim
    lines = shim_lines(shim.stderr)
    assert len(lines) == 1, lines  # once per process, not per epoch
    assert "lacks _MultiProcessingDataLoaderIter._try_get_data(timeout)" in lines[0], lines
    assert "torch's own iterator runs instead" in lines[0]
    # The same torch, unmoved: the same batches (the control), and no line, but
    # on a torch that lacks a name itself (torch < 2.1: its one line, by design).
    healthy = run_script(tmp_path, AUGMENTED.format(moved=""), start_method="fork",
                         activation="env")
    assert healthy.batches == plain.batches and not acted(healthy.stderr), healthy


def test_moved_worker_names_leave_torch_s_error_and_say_the_fix_did_not_hold(tmp_path):
    """As on macOS a generator does not pickle and the ladder's last rung is
    emulated workers; a torch without the names they need gets torch's own
    error, and the record says the fix did not hold."""
    body = GENERATOR.format(moved=MOVED_WORKER_INFO)
    env = {"AUTOSAFE_TORCH_AS": "macos"}
    plain = run_script(tmp_path, body, start_method="spawn")
    assert plain.rc != 0 and "cannot pickle 'generator' object" in plain.stderr, plain
    shim = run_script(tmp_path, body, env=env, activation="env")
    assert shim.rc != 0 and "cannot pickle 'generator' object" in shim.stderr, shim
    assert "AttributeError" not in shim.stderr, shim
    assert "lacks torch.utils.data._utils.worker.WorkerInfo" in shim.stderr, shim
    (record,) = logged(shim.stderr, "DL201")
    assert record.done.startswith("did not hold: this torch lacks"), record


# A file the dataset reads (repaired for spawn: reopened by path in each worker) and
# a class attribute main() sets to a function of its own that does not pickle (a
# lambda), which a spawned worker's import leaves at its default: the process state
# cannot be carried, and each worker refuses before its first batch (RemedyFailed).
RUNTIME_STATE = '''
import os, sys
import torch
from torch.utils.data import DataLoader, Dataset
{moved}
class Scaled(Dataset):
    scale = None  # main() may set a function of its own
    def __init__(self, path):
        self.fh = open(path, "rb")
    def __len__(self):
        return 8
    def __getitem__(self, i):
        # os.pread: the fork twin's workers share one offset (a seek, then a read, races)
        value = float(os.pread(self.fh.fileno(), 1, i)[0])
        return torch.tensor(Scaled.scale(value) if Scaled.scale is not None else value)

if __name__ == "__main__":
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bytes.bin")
    with open(path, "wb") as out:
        out.write(bytes(range(8)))
    factor = float(sys.argv[1])
    if factor != 1:
        Scaled.scale = lambda value: value * factor
    torch.manual_seed(0)
    digest(DataLoader(Scaled(path), batch_size=2, num_workers=2))
'''


def test_a_repair_a_worker_cannot_apply_unwatched_stops_and_says_it_did_not_hold(tmp_path):
    """As on macOS (no fork rung), the file is reopened in each spawned worker and
    what main() set that the dataset's code reads is carried (DL220), but the
    function main() put on the class does not pickle, so each worker refuses. A
    watched torch steps down to emulated workers (tests/test_process_state.py); a
    torch whose names moved cannot, and runs torch's own iterator: the run stops
    with the one reason (NoExactRung), no batch of the workers' wrong state, and
    the records say the repairs did not hold, never "fixed"."""
    body = RUNTIME_STATE.format(moved=MOVED_TRY_GET_DATA)
    env = {"AUTOSAFE_TORCH_AS": "macos"}
    shim = run_script(tmp_path, body, env=env, activation="env", args=("3",))
    assert shim.rc != 0 and "NoExactRung" in shim.stderr, shim
    assert "Scaled.scale (train.py:" in shim.stderr, shim
    assert "cannot be carried to a spawned worker: it does not pickle" in shim.stderr, shim
    assert "this torch cannot watch its workers" in shim.stderr, shim
    assert "BATCHES" not in shim.stdout and "RemedyFailed" not in shim.stderr, shim
    records = {r.code: r for r in logged(shim.stderr)}
    assert records["DL201"].done.startswith("did not hold:"), records
    assert records["DL220"].done.startswith("did not hold:"), records
    assert "summary: fixed" not in shim.stderr and "did not hold DL201" in shim.stderr, shim
    # Where the worker's state is the program's (the default kept), the repair held:
    # the batches of the same program under fork, and the record says fixed.
    held = run_script(tmp_path, body, env=env, activation="env", args=("1",))
    plain = run_script(tmp_path, body, start_method="fork", args=("1",))
    assert held.rc == 0 and held.batches == plain.batches, held
    (record,) = logged(held.stderr, "DL201")
    assert not record.done.startswith("did not hold"), record
    assert "summary: fixed DL201" in held.stderr, held
