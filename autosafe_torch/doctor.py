"""``autosafe-torch doctor``: the facts the rules use, and what would fire."""

import os
import platform
import sys

from . import facts
from .facts import open_file_limit, shm_bytes  # noqa: F401 (one place: facts)


def cv2_state():
    if "cv2" not in sys.modules:
        try:
            import importlib.util

            if importlib.util.find_spec("cv2") is None:
                return None
        except (ImportError, ValueError):
            return None
    try:
        import cv2

        return {"version": cv2.__version__, "threads": cv2.getNumThreads(),
                "opencl": bool(cv2.ocl.useOpenCL())}
    except Exception as exc:
        return {"error": repr(exc)}


def default_loader_findings(f):
    """Rules that fire for DataLoader(ds, num_workers=2, pin_memory=True) here."""
    from .rules import Context, checks_at, loader_args

    args = {"num_workers": 2, "prefetch_factor": None, "persistent_workers": False,
            "multiprocessing_context": None, "timeout": 0, "pin_memory": True}
    ctx = Context(f, defaults={"prefetch_factor": None})
    out = []
    for check in checks_at("dataloader.init"):
        found = check(args, ctx) if check.__module__ == loader_args.__name__ else None
        if found is not None:
            out.append("%s %s: %s" % (found.rule.code, found.rule.slug, found.why))
    return out


def report():
    import torch

    f = facts.current()
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "start_method": f.start_method,
        "cpus_usable": f.cpus_usable,
        "cpus_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
        "cgroup_cpu_limit": facts.cgroup_cpu_limit(),
        "dev_shm_bytes": shm_bytes(),
        "open_file_limit": open_file_limit(),
        "accelerator": f.accelerator,
        "cuda_initialized": f.cuda_initialized,
        "cv2": cv2_state(),
        "default_loader_rules": default_loader_findings(f),
    }


def report_text():
    r = report()
    shm = r["dev_shm_bytes"]
    lines = ["autosafe-torch doctor"]
    for key, value in r.items():
        if key == "default_loader_rules":
            continue
        if key == "dev_shm_bytes" and shm is not None:
            value = "%.1f MiB" % (shm / 2 ** 20)
        lines.append("  %-18s %s" % (key + ":", "none" if value is None else value))
    fired = r["default_loader_rules"]
    lines.append("  rules for DataLoader(ds, num_workers=2, pin_memory=True):")
    lines.extend("    " + line for line in fired or ["none would fire"])
    return "\n".join(lines)
