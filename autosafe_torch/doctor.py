"""``autosafe-torch doctor``: the facts the rules use, what would fire, and
broken combinations of packages it can detect cheaply, with their fix."""

import contextlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import subprocess
import sys

from . import facts
from .rules import InitContext, checks_at, loader_args


def cv2_state():
    if "cv2" not in sys.modules and not _installed("cv2"):
        return None
    try:
        import cv2  # noqa: PLC0415 - optional dependency (cv2), imported only where find_spec finds it

        # Never cv2.ocl.useOpenCL() here: it creates the OpenCL context that
        # forked workers must not inherit (CV402); a fresh interpreter is asked.
        return {"version": cv2.__version__, "threads": cv2.getNumThreads(),
                "opencl_device": facts.opencl_device_usable(),
                "opencl_used_here": facts.opencl_runtime_loaded() is not None}
    except Exception as exc:
        return {"error": repr(exc)}


def default_loader_findings(f):
    """Rules that fire for DataLoader(ds, num_workers=2, pin_memory=True) here."""
    args = {"num_workers": 2, "prefetch_factor": None, "persistent_workers": False,
            "multiprocessing_context": None, "timeout": 0, "pin_memory": True}
    ctx = InitContext(f, defaults={"prefetch_factor": None})
    found = (check(args, ctx) for check in checks_at("dataloader.init")
             if check.__module__ == loader_args.__name__)
    return ["%s %s: %s" % (x.rule.code, x.rule.slug, x.why) for x in found if x is not None]


# Companion packages with native operators built against one torch build: a
# wheel for another build (a CUDA torchvision with a CPU torch) fails at import,
# and so do the packages that import it when it is installed.
NATIVE_COMPANIONS = ("torchvision", "torchaudio")
IMPORTED_BY = {"torchvision": ("torchmetrics", "lightning", "pytorch_lightning")}

_IMPORT_PROBE = """
import sys, json
out = {}
for name in sys.argv[1:]:
    try:
        module = __import__(name)
        out[name] = {"ok": True, "version": getattr(module, "__version__", None)}
    except BaseException as exc:
        out[name] = {"ok": False, "error": "%s: %s" % (type(exc).__name__, exc)}
print(json.dumps(out))
"""


def _installed(name):
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def matching_version(name, torch_version):
    """The companion release made for this torch (torchvision 0.15 for torch 2.0, one
    minor per torch minor; torchaudio shares torch's version from 2.1), as a pip
    specifier's version ("0.28.*"), or None."""
    try:
        major, minor = (int(x) for x in torch_version.split("+")[0].split(".")[:2])
    except ValueError:
        return None
    if major != 2:
        return None
    if name == "torchvision":
        return "0.%d.*" % (minor + 15)
    if name == "torchaudio" and minor >= 1:
        return "2.%d.*" % minor
    return None


def broken_combinations(torch_version, timeout=120):
    """Problems found by importing each installed companion in a child process
    (a failed native import can leave this one half-initialised)."""
    names = [n for n in NATIVE_COMPANIONS if _installed(n)]
    if not names:
        return []
    env = dict(os.environ, AUTOSAFE_TORCH="0")  # the package as it is, without us
    try:
        proc = subprocess.run([sys.executable, "-c", _IMPORT_PROBE] + names, env=env,
                              capture_output=True, text=True, timeout=timeout, check=False)
        results = json.loads(proc.stdout.strip().splitlines()[-1])
    except Exception as exc:
        return [{"what": "could not check %s" % ", ".join(names), "error": repr(exc),
                 "fix": "run python -c 'import %s' to see the error" % names[0]}]
    problems = []
    local = "+" in torch_version and torch_version.split("+", 1)[1] or None
    for name in names:
        result = results.get(name, {})
        if result.get("ok"):
            continue
        version = "(unknown version)"
        with contextlib.suppress(Exception):
            version = importlib.metadata.version(name) or version
        build = "the %s build of torch %s" % (local, torch_version) if local else \
            "torch %s" % torch_version
        users = [u for u in IMPORTED_BY.get(name, ()) if _installed(u)]
        also = (" Installed packages that import it when it is there fail too: %s."
                % ", ".join(users)) if users else ""
        index = "https://download.pytorch.org/whl/%s" % (local or "cpu")
        match = matching_version(name, torch_version)
        spec = "%s==%s" % (name, match) if match else name
        problems.append({
            "what": "%s %s does not load with %s (a wheel built for another torch build, "
                    "e.g. a CUDA torchvision with a CPU torch).%s" % (name, version, build, also),
            "error": result.get("error", "import failed"),
            "fix": "pip uninstall %s if nothing needs it; otherwise install the %s built for "
                   "this torch: pip install '%s' --index-url %s" % (name, name, spec, index),
        })
    return problems


def report():
    import torch  # noqa: PLC0415 - torch: 0.9 s at doctor's import (-X importtime), which gives facts and the rules without it

    f = facts.current()
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "start_method": f.start_method,
        "cpus_usable": f.cpus_usable,
        "cpus_affinity": f.cpus_affinity,
        "cgroup_cpu_limit": facts.cgroup_cpu_limit(),
        "dev_shm_bytes": facts.shm_bytes(),
        "open_file_limit": f.open_file_limit,
        "accelerator": f.accelerator,
        "cuda_initialized": f.cuda_initialized,
        "cv2": cv2_state(),
        "default_loader_rules": default_loader_findings(f),
        "problems": broken_combinations(torch.__version__),
    }


def report_text():
    r = report()
    lines = ["autosafe-torch doctor"]
    for key, value in r.items():
        if key in ("default_loader_rules", "problems"):
            continue
        if key == "dev_shm_bytes" and value is not None:
            value = "%.1f MiB" % (value / 2 ** 20)
        lines.append("  %-18s %s" % (key + ":", "none" if value is None else value))
    lines.append("  rules for DataLoader(ds, num_workers=2, pin_memory=True):")
    lines.extend("    " + line for line in r["default_loader_rules"] or ["none would fire"])
    lines.append("  broken combinations:")
    if not r["problems"]:
        lines.append("    none found (checked: %s, where installed)" % ", ".join(NATIVE_COMPANIONS))
    for p in r["problems"]:
        lines += ["    PROBLEM: %s" % p["what"], "      error: %s" % p["error"],
                  "      fix:   %s" % p["fix"]]
    return "\n".join(lines)
