"""Notebooks, in a real Jupyter kernel (ipykernel, run by nbclient).

Seed 000 was a notebook on macOS: a transform function and a MONAI
MapTransform subclass defined in cells, a DataLoader with 2 workers. Under
spawn (set before the kernel starts, as macOS's default is) each worker
must unpickle the dataset, and nothing defined in a cell can be imported
there: the worker dies and torch says "DataLoader worker (pid(s) N) exited
unexpectedly". With ``%load_ext autosafe_torch`` or ``AUTOSAFE_TORCH=1`` in
the kernel's environment the loader yields the batches of a fork run, and
the log names the cell as IPython does: ``Cell In[N], line L``.

No MONAI here: ``MapLike`` is what a MapTransform is to this failure (a
class of the notebook, applying a function of the notebook to some keys).
"""

import json
import re

import pytest

from support import PLATFORM_SIM, assert_readable, clean_env, logged, once_per_run

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

CELLS = [
    "import hashlib\nimport torch\nfrom torch.utils.data import DataLoader, Dataset",
    # a random augmentation: the batches depend on each worker's seed
    "def jitter(x):\n    return x * 2.0 + torch.rand(())",
    '''class MapLike:
    """Like MONAI's MapTransform: a function applied to some keys of a dict."""
    def __init__(self, keys, fn):
        self.keys, self.fn = keys, fn

    def __call__(self, data):
        d = dict(data)
        for k in self.keys:
            d[k] = self.fn(d[k])
        return d''',
    '''class Items(Dataset):
    def __init__(self, n, transform):
        self.data = [{"image": torch.full((3,), float(i)), "label": i} for i in range(n)]
        self.transform = transform

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return self.transform(self.data[i])''',
    '''torch.manual_seed(0)
loader = DataLoader(Items(8, MapLike(["image"], jitter)), batch_size=2, num_workers=2)
h = hashlib.sha256()
for batch in loader:
    h.update(batch["image"].numpy().tobytes() + batch["label"].numpy().tobytes())
print("BATCHES", h.hexdigest())''',
]
LOOP_LINE = CELLS[-1].splitlines().index("for batch in loader:") + 1

LOAD = "%load_ext autosafe_torch"
UNLOAD = '''%unload_ext autosafe_torch
import os
print("AFTER", os.environ.get("AUTOSAFE_TORCH"), type(DataLoader.__dict__["__init__"]).__name__)'''


class Cell:
    def __init__(self, cell):
        self.source = cell.source
        self.count = cell.get("execution_count")
        self.stdout = "".join(o.text for o in cell.outputs
                              if o.output_type == "stream" and o.name == "stdout")
        self.stderr = "".join(o.text for o in cell.outputs
                              if o.output_type == "stream" and o.name == "stderr")
        self.errors = ["%s: %s" % (o.ename, o.evalue) for o in cell.outputs
                       if o.output_type == "error"]


def run_notebook(tmp_path, cells, start_method, env=None):
    """Execute ``cells`` in a new kernel of this Python, the start method set by
    tests/platform_sim before the kernel starts; one Cell per cell."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient
    import sys

    kernels = tmp_path / "kernels"
    (kernels / "autosafe-test").mkdir(parents=True, exist_ok=True)
    (kernels / "autosafe-test" / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "autosafe_torch tests", "language": "python"}))
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    kernel_env = clean_env(dict(env or {}, AUTOSAFE_TEST_START_METHOD=start_method,
                                PYTHONPATH=str(PLATFORM_SIM)))
    manager = KernelManager(kernel_name="autosafe-test",
                            kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(kernels)]))
    NotebookClient(nb, km=manager, timeout=180, allow_errors=True).execute(
        env=kernel_env, cwd=str(tmp_path))
    return [Cell(c) for c in nb.cells]


def batches(cells):
    found = re.findall(r"^BATCHES (\w+)$", cells[-1].stdout, re.M)
    return found[0] if found else None


@pytest.fixture(scope="module")
def fork_batches(tmp_path_factory):
    """The known-safe run: the same notebook with fork workers, without the shim
    (once in the whole test run)."""

    def run():
        cells = run_notebook(tmp_path_factory.mktemp("fork"), CELLS, "fork")
        assert batches(cells), [c.errors + [c.stderr] for c in cells]
        return batches(cells)

    return once_per_run(tmp_path_factory, "notebook-fork-batches", run)


def _repaired(cells, fork_batches):
    """The loop's cell gave fork's batches, and its one record names the cell."""
    loop = cells[-1]
    assert not loop.errors and batches(cells) == fork_batches, (loop.errors, loop.stderr)
    records = logged(loop.stderr)
    assert len(records) == 1, loop.stderr
    (record,) = records
    assert record.site == "Cell In[%d], line %d" % (loop.count, LOOP_LINE), loop.stderr
    assert record.code in ("DL202", "DL203") and "sent by value to 2 workers" in record.done
    assert "; workers start warm" in record.done  # DL209, a clause of the same line
    assert record.fix.startswith("move the function or class into a .py module next to "
                                 "the notebook and import it"), record
    assert "/tmp/ipykernel" not in loop.stderr
    for cell in cells:
        assert_readable(cell.stderr)


def test_without_autosafe_torch_the_workers_die_under_spawn(tmp_path, fork_batches):
    cells = run_notebook(tmp_path, CELLS, "spawn")
    loop = cells[-1]
    assert batches(cells) is None
    assert len(loop.errors) == 1 and re.match(
        r"RuntimeError: DataLoader worker \(pid\(s\) [\d, ]+\) exited unexpectedly$",
        loop.errors[0]), loop.errors
    # Each worker dies of "AttributeError: Can't get attribute 'Items' on <module
    # '__main__' (built-in)>" on the kernel's stderr, which reaches the cell only
    # when it comes before the cell's end: not checked.


def test_load_ext_repairs_it_with_the_batches_of_fork(tmp_path, fork_batches):
    cells = run_notebook(tmp_path, [LOAD] + CELLS + [UNLOAD], "spawn",
                         env={"AUTOSAFE_TORCH_AS": "macos"})
    loaded = cells[0]
    assert "not an IPython extension" not in loaded.stdout + loaded.stderr
    assert loaded.stderr == "autosafe_torch: on in this kernel and its DataLoader workers " \
        "(%unload_ext autosafe_torch turns it off)\n", loaded.stderr
    _repaired(cells[:-1], fork_batches)
    # named by the %load_ext line already: the record says nothing more
    assert "says more" not in "".join(cell.stderr for cell in cells), cells[-2].stderr
    unloaded = cells[-1]
    assert "AFTER None function" in unloaded.stdout, unloaded.stdout + unloaded.stderr
    assert "autosafe_torch: off in this kernel; summary: fixed " in unloaded.stderr


def test_the_environment_switch_repairs_it_too(tmp_path, fork_batches):
    """Nothing named the tool before the record (no %load_ext line, and a kernel
    prints no summary): the first record says whose it is, once."""
    cells = run_notebook(tmp_path, CELLS, "spawn",
                         env={"AUTOSAFE_TORCH": "1", "AUTOSAFE_TORCH_AS": "macos"})
    _repaired(cells, fork_batches)
    said = "".join(cell.stderr for cell in cells)
    assert said.count("(autosafe_torch: `autosafe-torch explain CODE` says more") == 1, said
