"""The fork rung's plan: what forked workers of a loader would share, and
whether fork is safe for it (``fork_is_safe``).
"""

import multiprocessing

from ..inspection import holdings, threads
from ..inspection.parts import PARTS
from . import IterContext

SAFE_FORK_PLATFORMS = ("linux",)
SPAWNING = ("spawn", "forkserver")
SPAWN_VERSIONS = ("every supported torch; spawn (macOS, Windows) and forkserver (Linux from "
                  "Python 3.14)")  # the rules' ``versions``


def start_method(args):
    from ..facts import effective_start_method  # noqa: PLC0415 - 0.2 ms at `import cv2` before torch, where the rules load (-X importtime: facts)

    return effective_start_method(args["multiprocessing_context"])


def forking(args):
    return args["num_workers"] > 0 and start_method(args) == "fork"


def spawning_workers(args, ctx: IterContext):
    """Workers that get pickles."""
    return args["num_workers"] > 0 and start_method(args) in SPAWNING and ctx.main_guarded()


def fork_plan(args, ctx):
    """``remedies.isolation.ForkPlan``, once per ``ctx``; empty for a dataset
    that reopens its files per process by itself."""
    from ..inspection.descriptors import shared_at_fork  # noqa: PLC0415 - 0.2 ms at `import torch` and at `import cv2`, where the rules load (-X importtime: inspection.descriptors)
    from ..remedies import isolation  # noqa: PLC0415 - 0.9 ms at `import torch` and at `import cv2`, where the rules load (-X importtime: remedies.isolation, reopen, descriptors, diagnostics, faulthandler)

    def make():
        # No file open for reading and no device: nothing to share, no object walked.
        if holdings.reopens_per_process(args["dataset"]) or not shared_at_fork():
            return isolation.ForkPlan([], [], [], [])
        return isolation.plan(isolation.users_parts(args))

    return per_parts(ctx, "fork_plans", args, make)


def per_parts(ctx, name, args, make):
    """``make()``, once per ``ctx`` and loader parts (by identity): the checks of
    one iteration share a plan."""
    key = tuple(id(args[part]) for part in PARTS)
    cache = ctx.plans.setdefault(name, {})
    if key not in cache:
        cache[key] = make()
    return cache[key]


def fork_is_safe(args, ctx: IterContext):
    """Rung 2: fork, where this platform allows it and the fork rung's remedies
    handle all forked workers would share (DL207, DL212, DL208); not for a
    lock held now or a live thread, which a forked child cannot inherit, nor
    after this loader's forked workers failed. CUDA initialised here is no
    reason: forked workers that touch it are recovered (DL205)."""
    if ctx.facts.platform not in SAFE_FORK_PLATFORMS or ctx.fork_failed is not None \
            or "fork" not in multiprocessing.get_all_start_methods() \
            or fork_plan(args, ctx).unhandled:
        return False
    return not (threads.others_alive() and holdings.fork_blockers(args["dataset"]))
