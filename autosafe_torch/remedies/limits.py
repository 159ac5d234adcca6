"""Open files for DataLoader workers: the soft limit, and torch's sharing strategy
(DL304). Each is a remedy ``remedy(args)`` or a worker_init step."""


def raise_soft_limit(target):
    """A remedy that raises RLIMIT_NOFILE's soft limit to ``target``, as
    ``ulimit -n`` does (never above the hard limit the caller checked)."""
    def raise_soft_limit(args):
        import resource  # noqa: PLC0415 - POSIX only: absent on Windows

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < target:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return raise_soft_limit


def file_system_sharing(_args_or_worker_id):
    """torch shares tensors through named files, no descriptor each: a remedy,
    and the worker step for spawn/forkserver workers, which start with
    torch's default strategy."""
    import torch.multiprocessing  # noqa: PLC0415 - torch: limits loads with the rules at `import cv2`, before the program imports torch

    torch.multiprocessing.set_sharing_strategy("file_system")

