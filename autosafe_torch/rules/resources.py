"""Shared memory and open files for DataLoader workers (DL303, DL304).

Workers hand every batch over in shared memory in /dev/shm under both of
torch's sharing strategies (measured on torch 2.13: switching strategy
does not help a small /dev/shm, and Docker gives a container 64 MiB).
Batches in flight, measured with a tmpfs of a chosen size: ``(prefetch_factor
* num_workers + 2) * batch bytes``. The batch size is known without user
code only for a TensorDataset. Any other dataset is never sampled:
``dataset[0]`` in the parent would run the user's ``__getitem__`` (a dataset
that synchronizes across workers hangs, a random generator's stream
advances); there, a real shared-memory failure is the signal (DL214).

With ``file_descriptor`` sharing the main process keeps one open file per
shared storage it holds: a collate function that returns per-sample
tensors, with many workers, passes the usual soft limit of 1024. Raising
the soft limit toward the hard one is what ``ulimit -n`` does; where the
hard limit is too low as well, ``file_system`` sharing needs no descriptors.
"""

import sys
from typing import NamedTuple

from ..remedies import limits
from ..remedies.workerinit import with_step
from .accel import default_collate
from . import number_of, rule
from .ladder import GROUP, emulated_workers

try:
    import resource

    RLIM_INFINITY = resource.RLIM_INFINITY
except ImportError:  # POSIX only: absent on Windows
    RLIM_INFINITY = -1

# Estimate only where the limit could plausibly be reached.
SHM_PROBE_BELOW = 8 * 2 ** 30
FDS_PROBE_BELOW = 65536
EXTRA_BATCHES = 2  # the batch the loop holds and the one being received
# tmpfs is full before the estimate says so (measured: 8 batches of 1 MiB
# do not fit in 8 MiB), so a quarter more.
SHM_HEADROOM = 1.25
# Descriptors the process needs for itself (libraries, pipes, sockets).
FD_RESERVE = 256
# A raised soft limit never goes past this (the kernel's default nr_open).
FD_CEILING = 1 << 20

DOCKER_FIX = ("give the container a larger /dev/shm: docker run --shm-size=2g "
              "(or --ipc=host); on Kubernetes mount an emptyDir with medium: "
              "Memory at /dev/shm")
FDS_FIX = ("raise the limit before starting (ulimit -n <hard limit>), or call "
           "torch.multiprocessing.set_sharing_strategy('file_system') at start")


class Profile(NamedTuple):
    nbytes: int  # of one sample
    tensors: int  # in one sample
    batch: int  # samples per batch (1 without automatic batching)


def sample_profile(values):
    """Where known without user code (a TensorDataset's shapes), else None."""
    torch = sys.modules.get("torch")
    dataset, sampler = values["dataset"], values["batch_sampler"]
    size = (values["batch_size"] or 1) if sampler is None else getattr(sampler, "batch_size", None)
    if not size or torch is None or not isinstance(dataset, torch.utils.data.TensorDataset):
        return None
    nbytes = sum((t.numel() // max(1, t.shape[0])) * t.element_size()
                 for t in dataset.tensors if t.dim())
    return Profile(nbytes, len(dataset.tensors), size)


def shm_needed(batch_bytes, workers, prefetch):
    return int((prefetch * workers + EXTRA_BATCHES) * batch_bytes * SHM_HEADROOM)


def _mib(n):
    return "%.1f MiB" % (n / 2 ** 20)


@rule("DL303", "shm-too-small", GROUP,
      summary=("/dev/shm cannot hold the batches in flight: fewer batches in flight "
               "(prefetch_factor), else the requested workers emulated in this process "
               "(no shared memory; each worker's seed and batches as asked), never fewer "
               "workers"),
      prevents=("RuntimeError: unable to allocate shared memory(shm) for file "
                "</torch_...>: No space left on device (28); 'DataLoader worker (pid N) "
                "is killed by signal: Bus error'"),
      fix=DOCKER_FIX,
      example=(("# docker run (64 MiB of /dev/shm)\n"
                "DataLoader(TensorDataset(images), batch_size=256, num_workers=4)"),
               ("# docker run --shm-size=2g (or --ipc=host)\n"
                "DataLoader(TensorDataset(images), batch_size=256, num_workers=4)")),
      versions="every supported torch, on Linux",
      at="dataloader.init",
      # it reads prefetch_factor, which DL106 may change
      after=("zero_prefetch_with_workers",))
def shm_too_small(values, ctx):
    workers = values["num_workers"]
    free = ctx.facts.shm_available
    if workers <= 0 or free is None or free >= SHM_PROBE_BELOW:
        return None
    profile = sample_profile(values)
    if profile is None:
        return None
    batch = profile.nbytes * profile.batch
    prefetch = values["prefetch_factor"] or 2  # torch's default
    need = shm_needed(batch, workers, prefetch)
    if need <= free:
        return None
    head = ("%d workers x prefetch_factor %d need about %s of /dev/shm for "
            "batches of %s; %s is free" % (workers, prefetch, _mib(need), _mib(batch),
                                           _mib(free)))
    for p in range(prefetch - 1, 0, -1):
        if shm_needed(batch, workers, p) <= free:
            return shm_too_small.rule.finding(
                {"prefetch_factor": values["prefetch_factor"]}, {"prefetch_factor": p},
                head + ". Fewer batches in flight fit; the batches are the same",
                strategy="lower prefetch_factor",
                done="prefetch_factor %d -> %d: /dev/shm has %s free, %s needed" % (
                    prefetch, p, _mib(free), _mib(need)))
    # Never fewer workers (ladder.LADDERS): the requested ones, emulated.
    return emulated_workers(
        shm_too_small, values, head + ". Not even one batch per worker fits",
        reason="/dev/shm has %s free, %s needed with one batch per worker" % (
            _mib(free), _mib(shm_needed(batch, workers, 1))))


@rule("DL304", "open-file-limit-too-low", GROUP,
      summary=("open-file soft limit too low for file_descriptor sharing: raise it "
               "toward the hard limit, or share through the file system"),
      prevents=("RuntimeError: Too many open files. Communication with the workers is no "
                "longer possible...; RuntimeError: received 0 items of ancdata"),
      fix=FDS_FIX,
      example=(("# ulimit -n 256\n"
                "DataLoader(TensorDataset(x, y), batch_size=64, num_workers=8)"),
               ("# ulimit -n 65536 before starting, or:\n"
                "torch.multiprocessing.set_sharing_strategy('file_system')")),
      versions="every supported torch, on Linux (file_descriptor sharing)",
      at="dataloader.init",
      # it reads prefetch_factor, which DL106 may change
      after=("zero_prefetch_with_workers",))
def open_file_limit_too_low(values, ctx):
    workers = values["num_workers"]
    nofile = ctx.facts.open_file_limit
    if workers <= 0 or ctx.facts.sharing_strategy != "file_descriptor" or not nofile:
        return None
    soft, hard = nofile
    if soft == RLIM_INFINITY or soft >= FDS_PROBE_BELOW:
        return None
    profile = sample_profile(values)
    if profile is None:
        return None
    # Default collation stacks each field into one tensor per batch; another
    # collate_fn may keep one tensor per sample.
    per_batch = profile.tensors if default_collate(values["collate_fn"]) \
        else profile.tensors * profile.batch
    need = per_batch * ((values["prefetch_factor"] or 2) * workers + EXTRA_BATCHES) * 4 + FD_RESERVE
    if soft >= need:
        return None
    head = ("%d workers with %d shared tensors per batch may need about %d open files; "
            "the soft limit is %d" % (workers, per_batch, need, soft))
    ceiling = FD_CEILING if hard == RLIM_INFINITY else min(hard, FD_CEILING)
    if ceiling >= need:
        return open_file_limit_too_low.rule.finding(
            {}, {}, head + ". Raised the soft limit to %d (the hard limit is %s), as "
            "`ulimit -n` does" % (ceiling, "unlimited" if hard == RLIM_INFINITY else hard),
            strategy="raise soft limit", remedies=[limits.raise_soft_limit(ceiling)],
            done="open-file soft limit %d -> %d: %s may need about %d" % (
                soft, ceiling, number_of(workers, "worker"), need))
    steps = [limits.file_system_sharing]
    if ceiling > soft:
        steps.insert(0, limits.raise_soft_limit(ceiling))
    old = values["worker_init_fn"]
    return open_file_limit_too_low.rule.finding(
        {"worker_init_fn": old}, {"worker_init_fn": with_step(old, limits.file_system_sharing)},
        head + " and the hard limit %d is too low as well: switched torch's sharing "
        "strategy to file_system, in this process and in every worker" % hard,
        strategy="file_system sharing", remedies=steps,
        done="tensors shared through file_system here and in each of %s: the open-file "
        "limit (%d, hard %d) is below the %d needed" % (
            number_of(workers, "worker"), soft, hard, need))
