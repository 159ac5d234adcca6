"""What forked workers would share (DL207, DL212, DL208's fork check: each
reads the one ``fork_plan``; what the fork rung cannot handle leaves fork,
``ladder.away_from_fork``), and what the workers report as they exit
(``dataloader.outcome``: DL207, DL217).
"""

from ..inspection import holdings, threads
from ..loaderstate import Kept
from ..remedies.workerinit import with_step
from . import IterContext, OutcomeContext, number_of, rule, what_is
from .fork_plan import fork_plan, forking
from .ladder import GROUP, away_from_fork
from .pickling import LAZY_OPEN_REWRITE, thread_pool_to_spawned_workers


def _owned(check, args, ctx, by_dl212, why=""):
    """``(fork plan, handles, away)``: the plan's handles that are DL212's (a
    forked child must not use them: lmdb, captures) or DL207's, and ``check``'s
    finding that leaves fork for those the fork rung cannot handle."""
    plan = fork_plan(args, ctx)
    handles = [(held, note) for held, _args, note in plan.handles
               if bool(held.fork_unsafe) == by_dl212]
    unhandled = "; ".join("%s %s" % (path, cause) for path, cause, fork_unsafe in plan.unhandled
                          if bool(fork_unsafe) == by_dl212)
    return plan, handles, unhandled and away_from_fork(check, args, ctx, why + unhandled,
                                                       repairs=False)


@rule("DL207", "shared-file-offset", GROUP,
      summary=("fork workers (and the children of a fork server): every file the process "
               "holds open for reading gets a description of its own in each worker, at "
               "the offset it had, under the same descriptor, whoever holds it (a file "
               "object, a raw os.open() descriptor, a closure, a C library); an h5py "
               "file is reopened by path in each worker; files only written stay shared"),
      prevents=("silently wrong samples: forked workers share one file offset "
                "(zipfile.BadZipFile: Bad CRC-32, gzip.BadGzipFile, EOFError: Compressed "
                "file ended before the end-of-stream marker was reached, other records, "
                "half the rows of a csv.reader)"),
      fix="open the file in worker_init_fn or lazily in __getitem__",
      example=(("class Records(Dataset):\n"
                "    def __init__(self, path):\n"
                "        self.fh = open(path, 'rb')   # one offset, shared by forked "
                "workers\n"
                "    def __getitem__(self, i):\n"
                "        self.fh.seek(i * SIZE)\n"
                "        return self.fh.read(SIZE)"),
               ("def open_in_worker(worker_id):\n"
                "    ds = torch.utils.data.get_worker_info().dataset\n"
                "    ds.fh = open(ds.path, 'rb')\n"
                "\n"
                "DataLoader(Records(path), num_workers=2, worker_init_fn=open_in_worker)")),
      versions="every supported torch; fork workers (Linux's default before Python 3.14)",
      rewrite=LAZY_OPEN_REWRITE,
      at="dataloader.iter",
      # the repairs that make a dataset pickle are made (or not) before a fork
      # loader is moved away from fork
      after=("unpicklable_dataset",))
def shared_file_offset(args, ctx: IterContext):
    if not forking(args):
        return None
    plan, handles, away = _owned(shared_file_offset, args, ctx, by_dl212=False)
    if away:
        return away
    if not (plan.isolate or handles):
        return None  # what no object shows is privatized all the same, and said if used
    what = ["%s: own offset" % d.describe() for d in plan.isolate]
    what += ["%s: reopened by path%s" % (held.path, ", " + note if note else "")
             for held, note in handles]
    if plan.shared:
        what.append("left shared, open for writing: %s" % ", ".join(
            d.describe() for d in plan.shared))
    return shared_file_offset.rule.finding(
        {"files": [d.path for d in plan.isolate] + [held.path for held, _ in handles]},
        why="forked workers would share one offset per file; in each worker: %s"
        % "; ".join(what), strategy="own offset in each worker",
        kept=Kept(fork_handles=bool(handles)),
        done=_fork_done(plan.isolate, handles, plan.shared, args["num_workers"]))


def _fork_done(isolated, handles, shared, workers):
    """DL207/DL212's log line."""
    each = number_of(workers, "forked worker")
    done = []
    if isolated:
        done.append("%s: own file offset in each of %s" % (
            ", ".join(d.path for d in isolated), each))
    if handles:
        done.append("%s reopened by path in each of %s" % (", ".join(
            "%s (%s)" % (held.path, held.fork_unsafe or what_is(held.obj))
            for held, _note in handles), each))
    if shared:
        done.append("left shared, open for writing: %s" % ", ".join(d.path for d in shared))
    return "; ".join(done)


@rule("DL212", "handle-not-fork-safe", GROUP,
      summary=("fork workers and a dataset holding a native handle a forked child must "
               "not use: an lmdb environment (reopened read-only) or a cv2.VideoCapture "
               "of a file is reopened by path in each worker (the capture at the same "
               "frame); a capture that cannot be reopened (a camera, a stream): spawn "
               "where everything pickles, else emulated workers"),
      prevents=("forked workers that hang in cv2.VideoCapture.read() once the parent has "
                "decoded (RuntimeError: DataLoader timed out after N seconds, or "
                "forever); an lmdb environment used after fork, which LMDB forbids "
                "(segfaults, readers registered under the parent's pid)"),
      fix="open the environment or capture in worker_init_fn or lazily in __getitem__",
      example=(("class Frames(Dataset):\n"
                "    def __init__(self, path):\n"
                "        self.env = lmdb.open(path, readonly=True)   # used after fork"),
               ("class Frames(Dataset):\n"
                "    def __init__(self, path):\n"
                "        self.path, self.env = path, None\n"
                "    def __getitem__(self, i):\n"
                "        if self.env is None:\n"
                "            self.env = lmdb.open(self.path, readonly=True)\n"
                "        ...")),
      versions="every supported torch; fork workers",
      at="dataloader.iter",
      # it reads the start method DL207 may have moved the loader to
      after=("shared_file_offset",))
def handle_not_fork_safe(args, ctx: IterContext):
    if not forking(args):
        return None
    _plan, handles, away = _owned(handle_not_fork_safe, args, ctx, by_dl212=True,
                                  why="a forked worker must not use the parent's handle, "
                                  "and it cannot be reopened: ")
    if away or not handles:
        return away or None
    return handle_not_fork_safe.rule.finding(
        {"handles": [held.path for held, _note in handles]},
        why="a forked worker must not use the parent's %s" % ", ".join(
            "%s (%s)%s" % (held.path, held.fork_unsafe, ", " + note if note else "")
            for held, note in handles),
        strategy="reopen in each worker", kept=Kept(fork_handles=True),
        done=_fork_done((), handles, (), args["num_workers"]))


# -- what the workers report as they exit (``dataloader.outcome``): what held ------


def _used(usage, how):
    return sorted((fd, name) for name, fd in usage.used.get(how, {}).items())


def _files(used):
    return ", ".join("%s (fd %d)" % (name, fd) for fd, name in used)


@shared_file_offset.rule.check_at("dataloader.outcome")
def read_through_no_object(args, ctx: OutcomeContext):
    """Files forked workers read through no object of the loader's (a raw
    descriptor, a C library), or that a fork server opened."""
    from ..remedies import isolation  # noqa: PLC0415 - 0.9 ms at `import torch` and at `import cv2`, where the rules load (-X importtime: remedies.isolation, faulthandler)

    named = any(i.code == shared_file_offset.rule.code for i in ctx.said)  # DL207 said them
    forked = [] if named else _used(ctx.usage, isolation.FORKED)
    server = _used(ctx.usage, isolation.SERVER)
    if not (forked or server):
        return None
    done = []
    if forked:
        done.append("%s: own file offset in each of %s, which read it through no object "
                    "the shim can name" % (_files(forked),
                                           number_of(ctx.workers, "forked worker")))
    if server:
        done.append("%s, opened by the fork server: own file offset in each of %s" % (
            _files(server), number_of(ctx.workers, "worker")))
    return read_through_no_object.rule.finding(
        {"files": [name for _fd, name in forked + server]},
        why="the workers read these files, which forked workers would share one offset "
        "of", strategy="own offset in each worker",
        shown={"privatized": True}, applied_by="worker step",
        done="; ".join(done))


@rule("DL217", "descriptor-to-workers", GROUP,
      summary=("spawn/forkserver workers of a dataset that reads a file through a "
               "descriptor of the training process, by its number (a raw os.open(), a "
               "library that keeps one): the descriptor reaches each worker under its "
               "number, at its own offset"),
      prevents=("OSError: [Errno 9] Bad file descriptor (or [Errno 29] Illegal seek) in "
                "a worker, or another file read without an error under that number (a "
                "forkserver worker's /dev/null)"),
      fix=("keep the path on the dataset and open the file in the process that reads it "
           "(lazily in __getitem__, or in worker_init_fn)"),
      example=(("class Records(Dataset):\n"
                "    def __init__(self, path):\n"
                "        self.fd = os.open(path, os.O_RDONLY)   # a number: spawn "
                "workers have no fd\n"
                "    def __getitem__(self, i):\n"
                "        os.lseek(self.fd, i * SIZE, os.SEEK_SET)\n"
                "        return os.read(self.fd, SIZE)"),
               ("class Records(Dataset):\n"
                "    def __init__(self, path):\n"
                "        self.path, self.fd = path, None\n"
                "    def __getitem__(self, i):\n"
                "        if self.fd is None:\n"
                "            self.fd = os.open(self.path, os.O_RDONLY)   # in each "
                "worker\n"
                "        os.lseek(self.fd, i * SIZE, os.SEEK_SET)\n"
                "        return os.read(self.fd, SIZE)")),
      versions=("every supported torch; spawn workers (macOS, Windows) and forkserver "
                "workers (Linux from Python 3.14)"),
      at="dataloader.outcome")
def descriptor_to_workers(args, ctx: OutcomeContext):
    """The carried descriptors the workers read (the offset moved), and those
    whose number the loader's parts hold (``os.pread`` moves no offset)."""
    from ..remedies import isolation  # noqa: PLC0415 - as in read_through_no_object

    usage = ctx.usage
    held = {fd: (name, usage.by_number[fd])
            for name, fd in usage.private.get(isolation.CARRIED, {}).items()
            if fd in usage.by_number}
    moved = [(fd, name) for fd, name in _used(usage, isolation.CARRIED) if fd not in held]
    if not (held or moved):
        return None
    named = ["%s: %s (fd %d)" % (where, name, fd) for fd, (name, where) in sorted(held.items())]
    if moved:
        named.append(_files(moved))
    return descriptor_to_workers.rule.finding(
        {"files": [name for name, _where in held.values()] + [name for _fd, name in moved]},
        why="the workers read these descriptors of the training process by number; "
        "spawn workers have none of them", strategy="carried to each worker",
        shown={"carried": True}, applied_by="worker step",
        done="%s, read by number: carried to each of %s, at its own offset" % (
            ", ".join(named), number_of(ctx.workers, "worker")))


# it reads the start method DL207 and DL212 may have moved the loader to
@thread_pool_to_spawned_workers.rule.check_at("dataloader.iter", after=("handle_not_fork_safe",))
def thread_pool_under_fork(args, ctx):
    from ..remedies import pools  # noqa: PLC0415 - imports torch: the rules load at `import cv2`, before the program imports torch

    if not forking(args) or not threads.others_alive():
        return None  # a pool in use has threads: with none alive, none is (no walk)
    used = [here for here, pool, _edge in holdings.find_thread_pools(args["dataset"])
            if holdings.thread_pool_in_use(pool)]
    if not used:
        return None
    init = with_step(args["worker_init_fn"], pools.rebuild_pools_in_worker)
    if init is args["worker_init_fn"]:
        return None
    return thread_pool_under_fork.rule.finding(
        {"worker_init_fn": args["worker_init_fn"]}, {"worker_init_fn": init},
        "the pool at %s has threads in this process; a forked worker would inherit it "
        "without them and wait forever on its first submit()" % ", ".join(used),
        strategy="new pool per worker",
        done="%s (a thread pool) made anew, empty, in each of %s" % (
            ", ".join(used), number_of(args["num_workers"], "forked worker")))


def own_descriptions_wanted(enabled):
    """``(DL207 on, DL217 on)``, given ``enabled(rule)``."""
    return enabled(shared_file_offset.rule), enabled(descriptor_to_workers.rule)
