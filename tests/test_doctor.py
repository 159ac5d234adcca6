"""``autosafe-torch doctor``: broken package combinations, found without breaking anything.

torchvision 0.28.0 on the package index is a CUDA build; with the CPU torch
its import fails ("operator torchvision::nms does not exist"), and
torchmetrics imports it, which breaks ``import lightning``. No torchvision
is installed here (none loads with this torch), so a package of that name
on PYTHONPATH stands in for it: one whose import fails exactly that way,
and one that loads.
"""

import os
import json
import sys

from support import clean_env, run_command

NMS_ERROR = "operator torchvision::nms does not exist"


def _fake_torchvision(root, body):
    pkg = root / "torchvision"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("import torch\n" + body)
    return root


def _doctor(pythonpath, *args):
    return run_command([sys.executable, "-m", "autosafe_torch", "doctor", *args], os.getcwd(),
                       clean_env({"PYTHONPATH": str(pythonpath)}), 180)


def test_doctor_names_a_torchvision_that_does_not_load_and_the_fix(tmp_path):
    root = _fake_torchvision(tmp_path / "broken",
                             "raise RuntimeError(%r)\n" % NMS_ERROR)
    plain = run_command([sys.executable, "-c", "import torchvision"], os.getcwd(),
                        clean_env({"PYTHONPATH": str(root)}), 120)
    assert plain.returncode != 0 and NMS_ERROR in plain.stderr
    proc = _doctor(root, "--json")
    assert proc.returncode == 0, proc.stderr
    problems = json.loads(proc.stdout)["problems"]
    assert len(problems) == 1, problems
    assert problems[0]["what"].startswith("torchvision") and "does not load" in problems[0]["what"]
    assert NMS_ERROR in problems[0]["error"]
    assert "pip uninstall torchvision" in problems[0]["fix"]
    assert "torchvision==0.%d.*" % (int(__import__("torch").__version__.split(".")[1]) + 15) \
        in problems[0]["fix"]
    text = _doctor(root)
    assert text.returncode == 0 and "PROBLEM: torchvision" in text.stdout
    assert "Traceback" not in text.stdout + text.stderr


def test_doctor_quiet_about_a_torchvision_that_loads(tmp_path):
    root = _fake_torchvision(tmp_path / "healthy", "__version__ = '0.0.1'\n")
    proc = _doctor(root, "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["problems"] == []
