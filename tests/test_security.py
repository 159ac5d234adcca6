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


# A local process that found a fork server's socket asks it for a process, and
# sends what a stranger would: a pickle that runs code as it is loaded (it writes a
# file). Against the fork server Python's multiprocessing starts, the code runs; the
# shim's warm server, started here for a loader repaired as on macOS, ends the child
# before it reads a byte of the pickle (exit status 88), and the loader's own
# workers, which bring the run's secret, run as ever.
STRANGER = r'''
import os, pickle, sys
import torch
from multiprocessing import forkserver
from torch.utils.data import DataLoader, Dataset

class Held(Dataset):
    def __init__(self, path):
        self.fh = open(path, "rb")
    def __len__(self):
        return 8
    def __getitem__(self, i):
        return torch.tensor([float(os.pread(self.fh.fileno(), 1, i)[0])])

class Payload:
    def __reduce__(self):
        return (os.system, ("touch %s" % sys.argv[2],))

def ask(address):
    """What a stranger sends, as multiprocessing's client does: a connection of its
    own to the server's socket, its own pipes, then the pickles."""
    import socket
    from multiprocessing import reduction, resource_tracker
    child_r, data_w = os.pipe()
    status_r, child_w = os.pipe()
    alive_r, _alive_w = os.pipe()
    with socket.socket(socket.AF_UNIX) as client:
        client.connect(address)
        reduction.sendfds(client, [child_r, child_w, alive_r, resource_tracker.getfd()])
    os.close(child_r)
    os.close(child_w)
    with open(data_w, "wb") as f:
        pickle.dump({"sys_path": sys.path}, f)
        pickle.dump(Payload(), f)
    forkserver.read_signed(status_r)  # the child's pid, then how it ended
    return forkserver.read_signed(status_r)

if __name__ == "__main__":
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data.bin")
    with open(path, "wb") as f:
        f.write(bytes(range(8)))
    if sys.argv[1] == "python":
        server = forkserver.ForkServer()
        server.ensure_running()
        print("STATUS", ask(server._forkserver_address), flush=True)
    else:
        loader = DataLoader(Held(path), batch_size=2, num_workers=2)
        print("FIRST", next(iter(loader)).tolist(), flush=True)
        from autosafe_torch.remedies import warmstart
        print("STATUS", ask(warmstart._state["server"]._forkserver_address), flush=True)
        digest(loader)
'''


def test_a_server_of_ours_serves_only_its_own_run(tmp_path):
    touched = tmp_path / "touched"
    python = run_script(tmp_path, STRANGER, args=("python", str(touched)))
    assert python.rc == 0 and touched.exists(), python  # what the shim guards against
    touched.unlink()
    ours = run_script(tmp_path, STRANGER, activation="env", args=("shim", str(touched)),
                      env={"AUTOSAFE_TORCH_AS": "macos"})
    assert ours.rc == 0 and "STATUS 88" in ours.stdout and ours.batches, ours
    assert not touched.exists()
    assert "DL209" in ours.stderr  # the loader's workers came from that server


def test_no_fork_server_of_ours_where_pythons_listens_for_any_local_user(monkeypatch):
    """CPython before the CVE-2022-42919 fix put a fork server's socket in the
    abstract namespace: there the shim starts none, says why, and workers spawn."""
    from autosafe_torch import facts, mp_private

    assert [v for v in ((3, 9, 15), (3, 9, 16), (3, 10, 8), (3, 10, 9), (3, 11, 0),
                        (3, 11, 1), (3, 12, 0)) if mp_private.forkserver_listens_abstract(v)] \
        == [(3, 9, 15), (3, 10, 8), (3, 11, 0)]
    assert facts.no_fork_server("linux") is None  # this Python: fixed
    monkeypatch.setattr(mp_private, "forkserver_listens_abstract", lambda: True)
    assert "CVE-2022-42919" in facts.no_fork_server("linux")
    assert not facts.fork_server_available("linux")


# A loader built again in each worker as on macOS (a ParquetFile from __init__: DL201's
# rebuild), whose build server starts ahead, in a thread, while the program goes on:
# the program's environment holds no variable of ours then or after (torch's own,
# which building the optimizer sets, aside).
ENVIRONMENT = '''
import os, sys
import pyarrow as pa, pyarrow.parquet as pq
import torch
from torch.utils.data import DataLoader, Dataset

class Days(Dataset):
    def __init__(self, path):
        self.file = pq.ParquetFile(path)
    def __len__(self):
        return 8
    def __getitem__(self, i):
        return torch.tensor([float(self.file.read().column(0)[i].as_py())])

if __name__ == "__main__":
    before = set(os.environ)
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "day.parquet")
    pq.write_table(pa.table({"x": [float(k) for k in range(8)]}), path)
    loader = DataLoader(Days(path), batch_size=2, num_workers=2)
    seen = set()
    for _ in range(200):  # while the server starts ahead
        seen |= set(os.environ) - before
    model = torch.nn.Linear(1, 1)
    torch.optim.SGD(model.parameters(), lr=0.1)
    digest(loader)
    seen |= set(os.environ) - before
    print("ADDED", sorted(seen - {"TORCHINDUCTOR_CACHE_DIR"}), flush=True)
'''


def test_no_variable_of_ours_enters_the_programs_environment(tmp_path):
    result = run_script(tmp_path, ENVIRONMENT, activation="env", env={"AUTOSAFE_TORCH_AS": "macos"})
    assert result.rc == 0 and result.batches, result
    assert "ADDED []" in result.stdout, result
    assert "dataset built once" in result.stderr or "DL209" in result.stderr, result


def test_every_promise_of_security_md_has_its_test():
    """SECURITY.md names a test for each promise: each exists."""
    import ast
    import re

    from support import ROOT

    named = re.findall(r"`(tests/test_\w+\.py)::(test_\w+)`", (ROOT / "SECURITY.md").read_text())
    assert len(named) >= 9, named
    for path, name in named:
        tree = ast.parse((ROOT / path).read_text())
        assert name in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}, \
            "%s::%s" % (path, name)
