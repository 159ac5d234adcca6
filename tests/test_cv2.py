"""CV401/CV402: OpenCV threads and OpenCL off, in the parent and every worker."""

import importlib.util
import pickle
import sys
import types

import pytest

from autosafe_torch.config import CONFIG
from autosafe_torch.facts import Facts
from autosafe_torch.patches import cv2 as cv2_patch
from autosafe_torch.remedies import cv2 as cv2_remedies
from autosafe_torch.remedies.workerinit import steps_of, user_function
from autosafe_torch.rules import Context
from autosafe_torch.rules import cv2 as cv2_rules
from support import line_of, logged, run_script

# Never import cv2 in this process: autosafe_torch is active here, and its
# cv2 patch would set OPENCV_* for every later test's subprocess.
if importlib.util.find_spec("cv2") is None:
    pytest.skip("opencv is not installed", allow_module_level=True)


def values(**changes):
    v = dict(num_workers=2, worker_init_fn=None)
    v.update(changes)
    return v


def user_init(worker_id):
    pass


def test_no_step_without_cv2_or_without_workers(monkeypatch):
    monkeypatch.delitem(sys.modules, "cv2", raising=False)
    assert cv2_rules.cv2_threads_in_workers(values(), Context(Facts())) is None
    monkeypatch.setitem(sys.modules, "cv2", types.ModuleType("cv2"))
    assert cv2_rules.cv2_threads_in_workers(values(num_workers=0), Context(Facts())) is None


def test_steps_merge_pickle_and_keep_the_users_function(monkeypatch):
    monkeypatch.setitem(sys.modules, "cv2", types.ModuleType("cv2"))
    v = values(worker_init_fn=user_init)
    f1 = cv2_rules.cv2_threads_in_workers(v, Context(Facts()))
    v.update(f1.after)
    f2 = cv2_rules.cv2_opencl_in_workers(v, Context(Facts()))
    fn = f2.after["worker_init_fn"]
    assert steps_of(fn) == (cv2_remedies.worker_threads_off, cv2_remedies.worker_opencl_off)
    assert user_function(fn) is user_init
    again = pickle.loads(pickle.dumps(fn))
    assert steps_of(again) == steps_of(fn)
    v.update(f2.after)
    assert cv2_rules.cv2_threads_in_workers(v, Context(Facts())) is None  # already there


class FakeCV2:
    def __init__(self, threads=4, opencl=True):
        self.threads = threads
        self.ocl = types.SimpleNamespace(useOpenCL=lambda: self.opencl,
                                         setUseOpenCL=self._set_ocl)
        self.opencl = opencl

    def _set_ocl(self, on):
        self.opencl = on

    def getNumThreads(self):
        return self.threads

    def setNumThreads(self, n):
        self.threads = n


def test_parent_findings_apply_settings_and_environment():
    fake, env = FakeCV2(), {}
    found = cv2_patch.findings(fake, env)
    assert [f.rule.code for f in found] == ["CV401", "CV402"]
    for f in found:
        for remedy in f.remedies:
            remedy({})
    assert fake.threads == 0 and fake.opencl is False
    assert env == {"OPENCV_FOR_THREADS_NUM": "1", "OPENCV_OPENCL_RUNTIME": "disabled"}
    assert cv2_patch.findings(fake, env) == []


def test_parent_keeps_an_environment_the_user_chose_and_honours_disable():
    fake, env = FakeCV2(), {"OPENCV_FOR_THREADS_NUM": "3"}
    for f in cv2_patch.findings(fake, env):
        for remedy in f.remedies:
            remedy({})
    assert env["OPENCV_FOR_THREADS_NUM"] == "3"
    CONFIG.disabled = frozenset({"cv2"})
    assert cv2_patch.findings(FakeCV2(), {}) == []


def test_parent_findings_name_only_what_changes():
    """OpenCL already off: CV402 is about the environment alone, never
    "opencl False -> False"; with the environment set too, nothing fires."""
    found = cv2_patch.findings(FakeCV2(threads=0, opencl=False), {})
    assert [(f.rule.code, f.before, f.after) for f in found] == [
        ("CV401", {"OPENCV_FOR_THREADS_NUM": None}, {"OPENCV_FOR_THREADS_NUM": "1"}),
        ("CV402", {"OPENCV_OPENCL_RUNTIME": None}, {"OPENCV_OPENCL_RUNTIME": "disabled"})]
    env = {"OPENCV_FOR_THREADS_NUM": "1", "OPENCV_OPENCL_RUNTIME": "disabled"}
    assert cv2_patch.findings(FakeCV2(threads=0, opencl=False), env) == []


def test_patch_never_breaks_import_cv2():
    class Broken:
        def getNumThreads(self):
            raise RuntimeError("boom")

    cv2_patch.unpatch()
    cv2_patch.patch(Broken())  # logged as an internal error, no exception
    cv2_patch.unpatch()


HOOK_BODY = '''
import autosafe_torch.patches as P
seen = []
_orig = P.apply_for
def spy(trigger, module):
    seen.append((trigger, module.__name__, hasattr(module, "__path__"),
                 hasattr(module, "_native")))
    return _orig(trigger, module)
P.apply_for = spy
import cv2
print("SEEN", seen, cv2.getNumThreads())
'''


def test_hook_fires_once_with_the_package_not_the_native_module(tmp_path):
    r = run_script(tmp_path, HOOK_BODY, activation="import")
    assert r.rc == 0, r
    assert "SEEN [('cv2', 'cv2', True, True)] 1" in r.stdout


def test_logged_at_the_import_line(tmp_path):
    r = run_script(tmp_path, "import os\nimport cv2\n", activation="import")
    assert r.rc == 0, r
    script = tmp_path / "train.py"
    line = script.read_text().splitlines().index("import cv2") + 1
    threads, opencl = logged(r.stderr, "CV401"), logged(r.stderr, "CV402")
    assert [x.site for x in threads + opencl] == ["train.py:%d" % line] * 2, r
    assert threads[0].done.startswith("cv2.setNumThreads(0) in this process"), threads
    assert "OPENCV_FOR_THREADS_NUM=1 for the processes it starts" in threads[0].done
    assert threads[0].fix == "call cv2.setNumThreads(0) at import and in worker_init_fn"


WORKER_BODY = '''
import cv2
import multiprocessing as mp
import torch
from torch.utils.data import DataLoader, Dataset

class Report(Dataset):
    def __len__(self):
        return 4
    def __getitem__(self, i):
        import cv2
        return torch.tensor([cv2.getNumThreads(), int(cv2.ocl.useOpenCL())])

class Pixels(Dataset):
    def __len__(self):
        return 8
    def __getitem__(self, i):
        import numpy as np
        img = np.full((32, 32), i, dtype=np.uint8)
        return torch.from_numpy(cv2.resize(img, (16, 16)))

if __name__ == "__main__":
    print("PARENT", cv2.getNumThreads(), int(cv2.ocl.useOpenCL()))
    for method in ("fork", "spawn", "forkserver"):
        ctx = mp.get_context(method)
        states = {tuple(row) for b in DataLoader(Report(), batch_size=2, num_workers=1,
                                                  multiprocessing_context=ctx) for row in b.tolist()}
        print("WORKER", method, sorted(states))
    digest(DataLoader(Pixels(), batch_size=4, num_workers=2))
'''


def test_worker_thread_count_and_opencl_under_every_start_method(tmp_path):
    off = run_script(tmp_path, WORKER_BODY)
    on = run_script(tmp_path, WORKER_BODY, activation="import")
    assert off.rc == 0, off
    assert on.rc == 0, on
    default = int(next(l.split()[1] for l in off.stdout.splitlines()
                       if l.startswith("PARENT")))
    for method in ("fork", "spawn", "forkserver"):
        assert "WORKER %s [(1, 0)]" % method in on.stdout, on
        # without it, workers run OpenCV's default pool (2 threads on 2 CPUs)
        assert "WORKER %s [(%d, 0)]" % (method, default) in off.stdout, off
    assert "PARENT 1 0" in on.stdout
    assert on.batches == off.batches


DEADLOCK_BODY = '''
import threading
import cv2, numpy as np, torch
from torch.utils.data import DataLoader, Dataset
img = np.random.RandomState(0).rand(1500, 1500).astype(np.float32)
stop = False
def busy():
    while not stop:
        cv2.resize(img, (1000, 1000))
        cv2.GaussianBlur(img, (15, 15), 0)
threads = [threading.Thread(target=busy, daemon=True) for _ in range(2)]
for t in threads:
    t.start()
class Resize(Dataset):
    def __len__(self):
        return 16
    def __getitem__(self, i):
        return torch.from_numpy(cv2.resize(img[i:i + 400, :400], (100, 100)))
digest(DataLoader(Resize(), batch_size=4, num_workers=2))
stop = True
for t in threads:
    t.join()
'''


@pytest.mark.parametrize("activation", [None, "import"])
def test_cv2_threads_in_parent_then_resize_in_forked_workers(tmp_path, activation):
    """The known hang. With OpenCV 5.0's pthreads backend it did not hang here,
    with or without autosafe_torch; the timeout keeps a hang from blocking CI."""
    r = run_script(tmp_path, DEADLOCK_BODY, activation=activation, start_method="fork",
                   timeout=90)
    assert r.rc == 0, r
    assert r.batches


AT_FORK_BODY = '''
import os
import cv2, numpy as np, torch
from torch.utils.data import DataLoader, Dataset
img = np.random.RandomState(0).rand(1500, 1500).astype(np.float32)
cv2.GaussianBlur(img, (15, 15), 0)  # the parent's pool, running
os.register_at_fork(before=lambda: print("AT FORK", cv2.getNumThreads(), flush=True))
class Blur(Dataset):
    def __len__(self):
        return 8
    def __getitem__(self, i):
        return torch.from_numpy(cv2.GaussianBlur(img[i:i + 200, :200], (5, 5), 0))
if __name__ == "__main__":
    digest(DataLoader(Blur(), batch_size=4, num_workers=2), epochs=2)
'''


def test_fork_workers_inherit_a_quiet_pool(tmp_path):
    """The seeds' hazard: a parent that ran a multi-threaded cv2 call, then fork
    workers that call cv2. Without the shim each worker is forked from a
    parent whose pool runs; with it, from one with no pool (CV401 at the
    import: the only moment no other thread can be inside cv2, see
    docs/how-it-decides.md), and the batches are the same. (The hang itself does not reproduce with
    OpenCV 5.0's pthreads backend: see the test above.)"""
    plain = run_script(tmp_path, AT_FORK_BODY, start_method="fork", timeout=90)
    shim = run_script(tmp_path, AT_FORK_BODY, start_method="fork", activation="import",
                      timeout=90)
    assert plain.rc == 0 and shim.rc == 0, shim
    running = [int(l.split()[-1]) for l in plain.stdout.splitlines() if l.startswith("AT FORK")]
    assert len(running) == 4 and min(running) > 1, plain  # two workers, two epochs
    assert shim.stdout.count("AT FORK 1") == 4, shim
    assert shim.batches == plain.batches


def test_as_on_macos_the_program_keeps_opencv_s_threads(tmp_path):
    """No worker is forked on macOS (nor Windows): the import leaves the
    program's threads, OpenCL and environment as they were (with no workers,
    OpenCV's threads are its only parallelism), and spawned workers still get
    cv2.setNumThreads(0) and OpenCL off from their worker_init_fn step."""
    body = WORKER_BODY.replace('for method in ("fork", "spawn", "forkserver"):',
                               'for method in ("spawn",):').replace(
        'print("PARENT", cv2.getNumThreads(), int(cv2.ocl.useOpenCL()))',
        'import os\n    print("PARENT", cv2.getNumThreads(), int(cv2.ocl.useOpenCL()), '
        'sorted(k for k in os.environ if k.startswith("OPENCV")))')
    off = run_script(tmp_path, body)
    on = run_script(tmp_path, body, activation="import", env={"AUTOSAFE_TORCH_AS": "macos"})
    assert off.rc == 0 and on.rc == 0, on
    parent = [l for l in off.stdout.splitlines() if l.startswith("PARENT")]
    assert parent and parent[0] in on.stdout.splitlines() and "PARENT 1 " not in parent[0], on
    assert "WORKER spawn [(1, 0)]" in on.stdout, on
    import_line = "train.py:%d" % line_of(tmp_path, "import cv2")
    sites = [r.site for r in logged(on.stderr, "CV401") + logged(on.stderr, "CV402")]
    assert sites and import_line not in sites, on  # the loaders' lines only
    assert on.batches == off.batches
