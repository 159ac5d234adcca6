"""Worker failures seen, not predicted (DL210-DL216): the recovery ladder.

A prediction at ``dataloader.iter`` can be wrong (a native handle judged
fork-safe, a thread pool nobody saw, a dataset that cannot be sized without
running it), so the workers are watched (``recovery``); the checks here run
at ``dataloader.failure`` once a recovery delivered, and make its record.
"""

from __future__ import annotations

import functools

from ..config import CONFIG
from ..inspection.failures import CUDA, DIED, FDS, HUNG, MEMORY, REMEDY, SHM
from ..report import HEADLINE_LIMIT
from ..remedies import process_state
from . import RULES, FailureContext, checks_at, rule
from . import start_method  # noqa: F401 - DL205, declared there, is recovered here
from .ladder import GROUP
from .repairs import REPAIRS
from .resources import DOCKER_FIX, FDS_FIX


def _recovery(declared, kind):
    """``declared``'s check at ``dataloader.failure``: its record, once the
    recovery from a failure of ``kind`` delivered."""
    def check(args, ctx: FailureContext):
        failure = ctx.failure
        if failure.kind != kind:
            return None
        why = "%s while batch %s was awaited" % (failure.what(), failure.batch)
        for rung, later in ctx.tried:
            why += "; %s failed too (%s)" % (rung, later.what())
        why += "; resumed at batch %s on %s" % (failure.batch, ctx.rung)
        why += (", every batch delivered once, as in a run without the failure"
                if ctx.exact is None else " (not exact: %s)" % ctx.exact)
        if failure.unsent:
            why += ". What the workers were to be sent did not pickle, here in the training " \
                "process: no worker ran"
        elif failure.starting:
            why += ". It died while starting (unpickling what it was sent, or importing the " \
                "main module)"
            why += "; its traceback:\n%s" % failure.dump if failure.dump else \
                ", before any of its steps ran"
        elif failure.dump and kind == CUDA:  # an exception torch passed on, not a crash
            why += ". The worker's traceback:\n%s" % failure.dump
        elif failure.dump:
            why += ". The worker's faulthandler output (%s):\n%s" % (
                "every worker's stacks" if kind == HUNG else "its traceback", failure.dump)
        elif failure.note:
            why += " (%s)" % failure.note
        # The headline names the rung by its first words ("emulated workers"): the
        # record's ``why`` and ``strategy`` have the rest.
        outcome = "; resumed at batch %s (%s%s)" % (
            failure.batch, ctx.rung.partition(" (")[0], "" if ctx.exact is None else ", not exact")
        room = HEADLINE_LIMIT - len("%s %s: " % (declared.code, declared.slug))
        done = failure.what(room=room - len(outcome)) + outcome
        fix = UNSENT_FIX if failure.unsent else STARTING_FIX if failure.starting else None
        if kind == REMEDY and process_state.REFUSED in failure.what():
            fix = process_state.FIX  # not a file: what the worker's import left
        return declared.finding(failure.before(str(ctx.first_rung)), why=why,
                                strategy=str(ctx.rung), shown={"rung": str(ctx.rung)},
                                applied_by="recovery", done=done, fix=fix)

    check.__name__ = declared.slug.replace("-", "_")
    declared.check_at("dataloader.failure")(check)


UNSENT_FIX = ("what the workers are sent must pickle when they start: open files and "
              "readers lazily in each worker, and only there (the training process that reads "
              "the dataset itself, ds[0], opens them here first), and define functions and "
              "classes at module level, not as lambdas or local functions")
STARTING_FIX = ("a spawned worker imports your main module and unpickles the dataset before "
                "any of your code runs: keep module-level work under if __name__ == "
                "'__main__': and make what that module imports importable in a new process "
                "(the exception above names the line)")

rule("DL210", "worker-died", GROUP,
     summary=("a DataLoader worker died (an exit code or a signal): the iterator is "
              "rebuilt (new workers, then emulated workers) and resumes at the first "
              "batch not delivered; the log names the worker, its signal or exit code "
              "and its Python traceback"),
     prevents=("RuntimeError: DataLoader worker (pid N) exited unexpectedly with exit "
               "code 1. Details are lost due to multiprocessing; ... is killed by "
               "signal: Segmentation fault / Killed; ConnectionResetError, EOFError"),
     fix=("read the worker's traceback (the JSON log's why, or AUTOSAFE_TORCH_DEBUG=1): "
          "a native library that is not fork-safe (create it in worker_init_fn, or use "
          "spawn); SIGKILL is the out-of-memory killer (fewer workers, a smaller "
          "prefetch_factor, smaller samples)"),
     example=(("DataLoader(ds, num_workers=2)   # a worker segfaults in a native "
               "library, or\n"
               "                                # the out-of-memory killer ends it"),
              ("def make_handle_in_worker(worker_id):\n"
               "    ds = torch.utils.data.get_worker_info().dataset\n"
               "    ds.handle = open_native_handle(ds.path)   # not inherited through "
               "fork\n"
               "\n"
               "DataLoader(ds, num_workers=2, worker_init_fn=make_handle_in_worker)")),
     versions="every supported torch")

rule("DL211", "worker-hung", GROUP,
     summary=("no batch for the watchdog's limit (AUTOSAFE_TORCH_HANG_TIMEOUT, longer "
              "where batches are slow, never shorter than timeout) while every worker "
              "lives: every worker's stack is logged, the iterator rebuilt and resumed "
              "at the first batch not delivered"),
     prevents=("a training loop that waits forever for its next batch (a lock or thread "
               "pool inherited through fork, a read without a timeout); RuntimeError: "
               "DataLoader timed out after N seconds"),
     fix=("read where the workers wait (the JSON log's why, or AUTOSAFE_TORCH_DEBUG=1): "
          "create locks, pools and connections in worker_init_fn or lazily in "
          "__getitem__, and give network reads a timeout"),
     example=(("class Remote(Dataset):\n"
               "    def __init__(self):\n"
               "        self.lock = threading.Lock()   # held by a parent thread at the "
               "fork\n"
               "    def __getitem__(self, i):\n"
               "        with self.lock: ..."),
              ("class Remote(Dataset):\n"
               "    def __getitem__(self, i):\n"
               "        if not hasattr(self, 'lock'):\n"
               "            self.lock = threading.Lock()   # made in each worker\n"
               "        with self.lock: ...")),
     versions="every supported torch")

rule("DL214", "shared-memory-failed", GROUP,
     summary=("a worker could not hand over a batch through /dev/shm (a bus error, "
              "'unable to allocate shared memory'): fewer batches in flight, then "
              "emulated workers, resumed at the first batch not delivered"),
     prevents=("RuntimeError: unable to allocate shared memory(shm) for file "
               "</torch_...>; DataLoader worker (pid N) is killed by signal: Bus error"),
     fix=DOCKER_FIX,
     example=(("# docker run (64 MiB of /dev/shm)\n"
               "DataLoader(images, batch_size=64, num_workers=4)"),
              ("# docker run --shm-size=2g (or --ipc=host)\n"
               "DataLoader(images, batch_size=64, num_workers=4)")),
     versions="every supported torch, on Linux (batches travel through /dev/shm)")

rule("DL213", "open-files-exhausted", GROUP,
     summary=("batches could not be received for lack of file descriptors: file_system "
              "sharing, then emulated workers, resumed at the first batch not delivered"),
     prevents=("RuntimeError: Too many open files. Communication with the workers is no "
               "longer possible; RuntimeError: received 0 items of ancdata"),
     fix=FDS_FIX,
     example=(("# ulimit -n 1024, and a collate_fn that returns many tensors per batch\n"
               "DataLoader(ds, num_workers=8, collate_fn=list_of_tensors)"),
              ("torch.multiprocessing.set_sharing_strategy('file_system')\n"
               "DataLoader(ds, num_workers=8, collate_fn=list_of_tensors)")),
     versions="every supported torch, on Linux (file_descriptor sharing)")

rule("DL215", "worker-out-of-memory", GROUP,
     summary=("a worker raised MemoryError (or ENOMEM) for a batch: once, the iterator "
              "is rebuilt with fewer batches in flight (prefetch_factor=1) and resumed "
              "at the first batch not delivered; raised again, it is torch's error"),
     prevents=("numpy.core._exceptions._ArrayMemoryError: Unable to allocate ...; "
               "MemoryError in a DataLoader worker (memory pressure from num_workers x "
               "prefetch_factor batches)"),
     fix="fewer workers or a smaller prefetch_factor, smaller samples or batches",
     example=(("# 4 workers x prefetch_factor 4: 16 large batches in flight at once\n"
               "DataLoader(volumes, batch_size=8, num_workers=4, prefetch_factor=4)"),
              ("DataLoader(volumes, batch_size=8, num_workers=4, prefetch_factor=1)\n"
               "# or fewer workers, smaller samples or batches")),
     versions="every supported torch")

rule("DL216", "repair-failed-in-worker", GROUP,
     summary=("a repair chosen before the workers started could not be applied in a "
              "worker (a file that could no longer be reopened there), or the workers "
              "could not be started (what they are sent did not pickle): never run with "
              "the hazard in place; the iterator is rebuilt on emulated workers and "
              "resumed at the first batch not delivered"),
     prevents=("a run that goes on with the hazard the repair was for: forked workers "
               "sharing a file offset (silently wrong samples), a handle a forked child "
               "must not use"),
     fix="open files lazily in __getitem__ (or in worker_init_fn), not in __init__",
     example=(("class Records(Dataset):\n"
               "    def __init__(self, path):\n"
               "        self.fh = open(path, 'rb')   # deleted or replaced before the "
               "workers start"),
              ("class Records(Dataset):\n"
               "    def __init__(self, path):\n"
               "        self.path, self.fh = path, None\n"
               "    def __getitem__(self, i):\n"
               "        if self.fh is None:\n"
               "            self.fh = open(self.path, 'rb')   # opened in each worker\n"
               "        ...")),
     versions="every supported torch; fork workers (the repairs of DL207 and DL212)")


# The rules whose check at ``dataloader.failure`` records the recovery from a failure
# of their kind (DL205's: who touched CUDA, at which line of the user's).
KINDS = {"DL210": DIED, "DL211": HUNG, "DL214": SHM, "DL213": FDS, "DL215": MEMORY,
         "DL216": REMEDY, "DL205": CUDA}
for _code, _kind in KINDS.items():
    _recovery(RULES[_code], _kind)


def kinds_watched(enabled):
    """The failure kinds recovered, given ``enabled(rule)`` (AUTOSAFE_TORCH_DISABLE);
    asked at every iterator's start, worked out once per configuration."""
    return _kinds_watched(enabled, CONFIG.disabled)


@functools.lru_cache(maxsize=1)
def _kinds_watched(enabled, _disabled):
    return frozenset(KINDS[c.rule.code] for c in checks_at("dataloader.failure", enabled))


def start_failures_recovered(enabled):
    """Whether a start that fails here (what the workers are sent does not
    pickle) goes to the next rung: where DL216 and every repair's rule are on;
    with one off, torch's error for what it would have repaired stands, at the
    start as at the plan."""
    codes = {r.code for r in REPAIRS} | {"DL216"}
    return all(enabled(RULES[code]) for code in codes if code in RULES)
