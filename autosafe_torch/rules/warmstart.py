"""Warm worker start (DL209, ``remedies/warmstart.py``), only for a loader
this hook repaired or moved to spawn: a healthy spawn loader is left alone.
Under forkserver there is nothing to add: Python's server imports the main
module, and torch with it, before it forks. Where no fork server can run
(Windows, a frozen executable), plain spawn, said once. Workers are not
reused across epochs: a persistent worker keeps the first epoch's seeds,
dataset copy and module state.
"""

from ..remedies.workerinit import with_step
from ..rung import Rung
from . import rule
from .ladder import GROUP, start_method

REPAIRED_FOR_SPAWN = ("DL201", "DL202", "DL203", "DL208", "DL205", "DL206")


@rule("DL209", "warm-worker-start", GROUP,
      summary=("spawn workers of a loader repaired by DL201/DL202/DL203/DL208 (or moved "
               "to spawn by DL205/DL206): forked from a warm server that has imported "
               "torch, numpy, cv2 and the dataset's installed libraries, with spawn's "
               "semantics (pickled dataset, main module imported in each worker); plain "
               "spawn where there is no fork server (Windows)"),
      prevents=("a repaired loader slower than num_workers=0: spawn workers import "
                "torch, numpy and cv2 again every epoch (over a second of CPU each)"),
      fix=("make the dataset pickle (see the DL20x line), then "
           "multiprocessing_context=multiprocessing.get_context('forkserver') after "
           "set_forkserver_preload(['torch', 'numpy', 'cv2']) where available; "
           "persistent_workers=True where per-epoch worker seeding does not matter"),
      example=(("# a loader repaired for spawn (DL201, DL202, DL203, DL208, DL205, "
                "DL206):\n"
                "# its workers import torch again every epoch\n"
                "DataLoader(ds, num_workers=2)"),
               ("ctx = multiprocessing.get_context('forkserver')\n"
                "ctx.set_forkserver_preload(['torch', 'numpy'])\n"
                "DataLoader(ds, num_workers=2, multiprocessing_context=ctx)")),
      versions=("every supported torch; spawn with a fork server (macOS, Linux under "
                "spawn); plain spawn on Windows"),
      at="dataloader.iter",
      # it reads every repair for spawn and whether a check emulated the workers
      after=("thread_pool_under_fork", "logging_config_to_workers", "memmap_by_reference",
             "process_state_to_workers"),
      clause_of=REPAIRED_FOR_SPAWN)
def warm_worker_start(args, ctx):
    if not args["num_workers"] or start_method(args) != "spawn" \
            or not any(ctx.found(code) for code in REPAIRED_FOR_SPAWN) \
            or any(f.rung is Rung.EMULATED for f in ctx.findings):
        return None
    from ..facts import no_fork_server  # noqa: PLC0415 - 0.2 ms at `import cv2` before torch, where the rules load (-X importtime: facts)

    none = no_fork_server(ctx.facts.platform)
    if none is not None:
        return warm_worker_start.rule.finding(
            {"multiprocessing_context": "spawn"}, why="%s: each worker imports torch and the "
            "dataset's modules afresh every epoch" % none, strategy="plain spawn",
            done="workers start by plain spawn (%s)" % none)
    from ..remedies import warmstart  # noqa: PLC0415 - 3.9/4.8 ms at `import torch` / `import cv2`, where the rules load (-X importtime: remedies.warmstart, faulthandler; at cv2's also multiprocessing.connection, spawn)

    libraries = warmstart.libraries_for(
        [args["dataset"], args["collate_fn"], args["worker_init_fn"]])
    return warm_worker_start.rule.finding(
        {"multiprocessing_context": args["multiprocessing_context"] or "spawn"},
        {"multiprocessing_context": warmstart.warm_context(
            args["multiprocessing_context"],
            builds=[d for f in ctx.findings for d in f.kept.rebuilt or ()],
            carry=next((f.kept.process_state for f in ctx.findings
                        if f.kept.process_state is not None), None)),
         "worker_init_fn": with_step(args["worker_init_fn"], warmstart.exit_with_parent)},
        "spawn workers would import %s again every epoch; a server that imported them "
        "once forks each worker, which then starts as spawn does" % ", ".join(libraries),
        rung=Rung.WARM_SPAWN, remedies=[lambda args: warmstart.preload(libraries)],
        done="workers start warm, from a fork server with %s imported"
             % warmstart.named(libraries))
