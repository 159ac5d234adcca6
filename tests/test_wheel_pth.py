"""The `.pth` activation for real: build the wheel, install it into a fresh
virtual environment, run a script with AUTOSAFE_TORCH=1 and without.

The venv reuses the installed torch (and wrapt, cloudpickle) through a path
line in a .pth of its own, which appends the base site-packages to sys.path
without running the base's .pth files: the autosafe_torch in use is the
wheel's, which the test checks.
"""

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from support import ROOT, clean_env, once_per_run, site_dirs

pytestmark = pytest.mark.slow

SCRIPT = '''
import sys
import torch
from torch.utils.data import DataLoader, TensorDataset
loader = DataLoader(TensorDataset(torch.arange(6.)), batch_size=2, prefetch_factor=2)
print("BATCHES", [b[0].tolist() for b in loader])
print("FROM", sys.modules["autosafe_torch"].__file__)
'''


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """(python, script, purelib): the wheel installed in a virtual environment (built
    once in the whole test run)."""
    return tuple(Path(p) for p in once_per_run(tmp_path_factory, "wheel-venv", lambda: [
        str(p) for p in _wheel_venv(tmp_path_factory)]))


def _wheel_venv(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir",
                    str(tmp / "dist"), str(ROOT)], check=True, capture_output=True, timeout=300)
    wheel = next((tmp / "dist").glob("autosafe_torch-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for shipped in ("autosafe_torch.pth", "autosafe_torch.start", "_autosafe_torch_start.py"):
        assert shipped in names, names
    assert not any(n.startswith("autosafe_torch/_site/") for n in names)
    env_dir = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True,
                   timeout=120)
    python = env_dir / "bin" / "python"
    purelib = Path(subprocess.check_output(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        text=True).strip())
    (purelib / "zz_reuse_base_torch.pth").write_text("".join(d + "\n" for d in site_dirs()))
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index",
                    "--target", str(purelib), str(wheel)], check=True, capture_output=True,
                   timeout=300)
    script = tmp / "legacy.py"
    script.write_text(SCRIPT)
    return python, script, purelib


def _run(python, script, env):
    return subprocess.run([str(python), str(script)], env=clean_env(env), capture_output=True,
                          text=True, timeout=120)


def test_without_the_variable_the_script_fails_as_before(venv):
    python, script, _ = venv
    proc = _run(python, script, {})
    assert proc.returncode == 1
    assert "prefetch_factor option could only be specified in multiprocessing" in proc.stderr


def test_dormant_hook_imports_nothing(venv):
    python, _, _ = venv
    out = subprocess.check_output([str(python), "-c", "import sys; print(sorted(m for m in "
                                   "sys.modules if 'autosafe' in m))"], env=clean_env(), text=True)
    assert out.strip() == "[]"


def test_with_the_variable_the_pth_activates(venv):
    python, script, purelib = venv
    proc = _run(python, script, {"AUTOSAFE_TORCH": "1"})
    assert proc.returncode == 0, proc.stderr
    assert "BATCHES [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]" in proc.stdout
    assert "FROM %s" % purelib in proc.stdout
    assert "%s:5: DL101 prefetch-without-workers: " % script in proc.stderr  # not under cwd


def test_start_file_entry_point_is_what_the_pth_calls(venv):
    """Python >= 3.15 reads autosafe_torch.start (PEP 829) instead of the .pth
    import line; both name the same function, which must be dormant unless on."""
    python, script, purelib = venv
    entry = (purelib / "autosafe_torch.start").read_text().strip()
    assert entry == "_autosafe_torch_start:run"
    assert "_autosafe_torch_start" in (purelib / "autosafe_torch.pth").read_text()
    code = ("import pkgutil, sys; pkgutil.resolve_name(%r)(); "
            "print('autosafe_torch' in sys.modules)" % entry)
    for env, expected in (({}, "False"), ({"AUTOSAFE_TORCH": "1"}, "True")):
        out = subprocess.run([str(python), "-S", "-c", "import sys; sys.path.append(%r); %s"
                              % (str(purelib), code)], env=clean_env(env), capture_output=True,
                             text=True, timeout=60)
        assert out.stdout.strip() == expected, out.stderr
