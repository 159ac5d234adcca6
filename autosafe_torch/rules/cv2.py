"""OpenCV in DataLoader workers (CV401, CV402).

OpenCV runs its own thread pool (and, where there is a runtime, OpenCL).
Used inside DataLoader workers it oversubscribes the CPUs (workers x
OpenCV threads), and a pool that existed in the parent when a worker was
forked has been the classic cause of workers that hang in ``cv2.resize``.
The fix everyone applies by hand: ``cv2.setNumThreads(0)`` and
``cv2.ocl.setUseOpenCL(False)``.

Each rule checks at two hooks. At the cv2 import (``cv2.import``), where
workers may be forked from this process (Linux): the setting in this
process, and an environment variable for processes started later (spawn
and forkserver workers import cv2 afresh, and setting it in the parent does
not reach them); elsewhere this process keeps its own (``_workers_may_fork``). At every loader with workers
(``dataloader.init``): a picklable ``worker_init_fn`` step that makes the
setting in the worker, before the user's own ``worker_init_fn`` (it covers a
forkserver started before cv2 was imported).

Nothing here imports cv2: the steps are added only when the program has
imported it, and a worker imports it only then.
"""

import sys

from ..remedies import cv2 as cv2_remedies
from ..remedies.workerinit import with_step
from . import number_of, rule

GROUP = "cv2"


@rule("CV401", "cv2-threads", GROUP,
      "cv2 imported: cv2.setNumThreads(0) in every DataLoader worker, and in the parent "
      "where workers may be forked (Linux)",
      "DataLoader workers that hang in cv2 calls after fork; workers x OpenCV "
      "threads oversubscribing the CPUs",
      "call cv2.setNumThreads(0) at import and in worker_init_fn",
      at="cv2.import")
def cv2_threads(args, ctx):
    if not _workers_may_fork(ctx):
        return None
    threads = ctx.cv2.getNumThreads()
    return _in_this_process(cv2_threads, ctx, cv2_remedies.ENV_THREADS, "threads", threads,
                            0, "OpenCV's thread pool in a process that forks DataLoader "
                            "workers", "cv2.setNumThreads(0)", cv2_remedies.threads_off)


@rule("CV402", "cv2-opencl", GROUP,
      "cv2 imported: OpenCL off in every DataLoader worker, and in the parent where "
      "workers may be forked (Linux)",
      "the same hangs, and every worker contending for the GPU through OpenCL",
      "call cv2.ocl.setUseOpenCL(False) at import and in worker_init_fn",
      at="cv2.import")
def cv2_opencl(args, ctx):
    if not _workers_may_fork(ctx):
        return None
    ocl = getattr(ctx.cv2, "ocl", None)
    opencl = bool(ocl.useOpenCL()) if ocl is not None else False
    return _in_this_process(cv2_opencl, ctx, cv2_remedies.ENV_OPENCL, "opencl", opencl,
                            False, "OpenCL off in this process",
                            "cv2.ocl.setUseOpenCL(False)", cv2_remedies.opencl_off)


def _workers_may_fork(ctx):
    """Whether DataLoader workers may be forked from this process: on Linux
    (fork, or the ladder's fork rung). There the pool is stopped at the import,
    the one moment no other thread of the program can be inside cv2 (changing
    OpenCV's thread count while another thread runs a cv2 call kills the
    process: figure 12b), and kept stopped. On macOS and Windows workers are
    spawned (macOS forks a process only while it has one thread, which a
    running pool would not leave it): the program keeps OpenCV's threads,
    its only parallelism where it loads in the main process (figure 12a)."""
    from .workers import SAFE_FORK_PLATFORMS

    return ctx.facts is None or ctx.facts.platform in SAFE_FORK_PLATFORMS


def _in_this_process(check, ctx, env_pair, setting, now, wanted, why, strategy, remedy):
    """A finding for what differs here: the setting, and the environment
    variable that carries it to processes started later. Only what changes
    is named (never "opencl False -> False")."""
    env, (key, value) = ctx.environ, env_pair
    before, after = {}, {}
    if now != wanted:
        before[setting], after[setting] = now, wanted
    if key not in env:
        before[key], after[key] = None, value
    if after:
        done = [strategy + " in this process"] if setting in after else []
        if key in after:
            done.append("%s=%s for the processes it starts" % (key, value))
        return check.rule.finding(
            before, state=after, why="%s; %s=%s for processes started later" % (
                why, key, env.get(key, value)), strategy=strategy,
            remedies=[lambda args: remedy(ctx.cv2, env)], done="; ".join(done))


def _add_step(check, args, step, what):
    if args["num_workers"] <= 0 or "cv2" not in sys.modules:
        return None
    old = args["worker_init_fn"]
    new = with_step(old, step)
    if new is old:
        return None
    return check.rule.finding(
        {"worker_init_fn": old}, {"worker_init_fn": new},
        "cv2 is imported; %s in each worker under every start method, before the "
        "worker_init_fn of the program" % what, strategy="worker_init_fn step",
        done="%s in each of %s (a worker_init_fn step before yours)" % (
            what, number_of(args["num_workers"], "worker")))


@cv2_threads.rule.check_at("dataloader.init")
def cv2_threads_in_workers(args, ctx):
    return _add_step(cv2_threads_in_workers, args, cv2_remedies.worker_threads_off,
                     "cv2.setNumThreads(0)")


@cv2_opencl.rule.check_at("dataloader.init")
def cv2_opencl_in_workers(args, ctx):
    return _add_step(cv2_opencl_in_workers, args, cv2_remedies.worker_opencl_off,
                     "cv2.ocl.setUseOpenCL(False)")
