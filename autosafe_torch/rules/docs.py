"""What ``autosafe-torch explain CODE`` adds to a rule's declaration.

For each rule code: an example (the code that fails, then the code of the
permanent fix) and the torch versions it concerns. The rest of what
``explain`` prints (what the rule fixes, the error it prevents, the fix, the
hooks) is the rule's own declaration, so the two cannot disagree. Kept here,
apart from the checks, because it is prose: a test fails while a registered
rule has no entry.
"""

DOCS = {
    # -- DataLoader arguments that need workers ------------------------------------
    "DL101": ((
        "DataLoader(ds, batch_size=32, num_workers=0, prefetch_factor=4)",
        "DataLoader(ds, batch_size=32, num_workers=workers,\n"
        "           prefetch_factor=4 if workers > 0 else None)"),
        "every supported torch (2.0 to 2.13): DataLoader.__init__ refuses any "
        "prefetch_factor but None without workers (torch 1.x refused any but 2)"),
    "DL102": ((
        "DataLoader(ds, num_workers=0, persistent_workers=True)",
        "DataLoader(ds, num_workers=workers, persistent_workers=workers > 0)"),
        "every supported torch (2.0 to 2.13)"),
    "DL103": ((
        "DataLoader(ds, num_workers=0, multiprocessing_context='spawn')",
        "DataLoader(ds, num_workers=workers,\n"
        "           multiprocessing_context='spawn' if workers > 0 else None)"),
        "every supported torch (2.0 to 2.13)"),
    "DL104": ((
        "# in a container limited to 2 CPUs (cgroup quota) on a 64-core host\n"
        "DataLoader(ds, num_workers=16)",
        "DataLoader(ds, num_workers=min(16, usable_cpus()))  # affinity and the quota"),
        "every supported torch: its own warning reads the CPU affinity, never the "
        "cgroup quota"),
    "DL105": ((
        "DataLoader(ds, num_workers=2, pin_memory=True)  # on a CPU-only machine",
        "DataLoader(ds, num_workers=2, pin_memory=torch.cuda.is_available())"),
        "torch versions whose DataLoader warns about it (2.13 does, 2.0 does not): "
        "the installed torch is asked, not its version number"),
    "DL106": ((
        "DataLoader(ds, num_workers=2, prefetch_factor=0)",
        "DataLoader(ds, num_workers=2)  # or prefetch_factor >= 1"),
        "every supported torch (2.0 to 2.13)"),
    "DL107": ((
        "DataLoader(ds, num_workers=0, timeout=60)",
        "DataLoader(ds, num_workers=workers, timeout=60 if workers > 0 else 0)"),
        "every supported torch; the message is a bare AssertionError on torch 2.0"),
    # -- what travels to workers, and how they start ------------------------------
    "DL201": ((
        "class Frames(Dataset):\n"
        "    def __init__(self, path):\n"
        "        self.fh = open(path, 'rb')        # does not pickle\n"
        "    def __getitem__(self, i):\n"
        "        self.fh.seek(i * SIZE)\n"
        "        return self.fh.read(SIZE)",
        "class Frames(Dataset):\n"
        "    def __init__(self, path):\n"
        "        self.path, self.fh = path, None\n"
        "    def __getitem__(self, i):\n"
        "        if self.fh is None:\n"
        "            self.fh = open(self.path, 'rb')  # opened in each worker\n"
        "        self.fh.seek(i * SIZE)\n"
        "        return self.fh.read(SIZE)"),
        "every supported torch; the platforms that start workers by spawn (macOS, "
        "Windows) or forkserver (Linux from Python 3.14)"),
    "DL202": ((
        "def main():\n"
        "    loader = DataLoader(ds, num_workers=2, collate_fn=lambda b: torch.stack(b))",
        "def stack(batch):                  # module level of an importable module\n"
        "    return torch.stack(batch)\n\n"
        "def main():\n"
        "    loader = DataLoader(ds, num_workers=2, collate_fn=stack)"),
        "every supported torch; spawn (macOS, Windows) and forkserver (Linux from "
        "Python 3.14)"),
    "DL203": ((
        "# a notebook cell, or python -c / stdin\n"
        "class Squares(Dataset): ...\n"
        "DataLoader(Squares(), num_workers=2)",
        "# squares.py, next to the notebook\n"
        "class Squares(Dataset): ...\n\n"
        "# the notebook\n"
        "from squares import Squares\n"
        "DataLoader(Squares(), num_workers=2)"),
        "every supported torch; spawn (macOS, Windows) and forkserver (Linux from "
        "Python 3.14)"),
    "DL204": ((
        "loader = DataLoader(ds, num_workers=2)\n"
        "for batch in loader:\n"
        "    train(batch)",
        "if __name__ == \"__main__\":\n"
        "    loader = DataLoader(ds, num_workers=2)\n"
        "    for batch in loader:\n"
        "        train(batch)"),
        "every supported torch; spawn (macOS, Windows) and forkserver (Linux from "
        "Python 3.14)"),
    "DL205": ((
        "model = Net().cuda()               # CUDA is initialised here\n"
        "DataLoader(ds, num_workers=2)      # Linux: fork workers",
        "DataLoader(ds, num_workers=2, multiprocessing_context='spawn')"),
        "every supported torch with CUDA, on Linux (fork)"),
    "DL206": ((
        "multiprocessing.set_start_method('fork')   # on macOS\n"
        "DataLoader(ds, num_workers=2)",
        "DataLoader(ds, num_workers=2)              # macOS's default: spawn"),
        "every supported torch, on macOS"),
    "DL207": ((
        "class Records(Dataset):\n"
        "    def __init__(self, path):\n"
        "        self.fh = open(path, 'rb')   # one offset, shared by forked workers\n"
        "    def __getitem__(self, i):\n"
        "        self.fh.seek(i * SIZE)\n"
        "        return self.fh.read(SIZE)",
        "def open_in_worker(worker_id):\n"
        "    ds = torch.utils.data.get_worker_info().dataset\n"
        "    ds.fh = open(ds.path, 'rb')\n\n"
        "DataLoader(Records(path), num_workers=2, worker_init_fn=open_in_worker)"),
        "every supported torch; fork workers (Linux's default before Python 3.14)"),
    "DL208": ((
        "class Decoded(Dataset):\n"
        "    def __init__(self):\n"
        "        self.pool = ThreadPoolExecutor(4)",
        "class Decoded(Dataset):\n"
        "    def __init__(self):\n"
        "        self.pool = None\n"
        "    def __getitem__(self, i):\n"
        "        if self.pool is None:\n"
        "            self.pool = ThreadPoolExecutor(4)   # made in each worker\n"
        "        ..."),
        "every supported torch; fork (a hang) and spawn/forkserver (a pickling error)"),
    "DL209": ((
        "# a loader repaired for spawn (DL201, DL202, DL203, DL208, DL205, DL206):\n"
        "# its workers import torch again every epoch\n"
        "DataLoader(ds, num_workers=2)",
        "ctx = multiprocessing.get_context('forkserver')\n"
        "ctx.set_forkserver_preload(['torch', 'numpy'])\n"
        "DataLoader(ds, num_workers=2, multiprocessing_context=ctx)"),
        "every supported torch; spawn with a fork server (macOS, Linux under spawn); "
        "plain spawn on Windows"),
    "DL210": ((
        "DataLoader(ds, num_workers=2)   # a worker segfaults in a native library, or\n"
        "                                # the out-of-memory killer ends it",
        "def make_handle_in_worker(worker_id):\n"
        "    ds = torch.utils.data.get_worker_info().dataset\n"
        "    ds.handle = open_native_handle(ds.path)   # not inherited through fork\n\n"
        "DataLoader(ds, num_workers=2, worker_init_fn=make_handle_in_worker)"),
        "every supported torch"),
    "DL211": ((
        "class Remote(Dataset):\n"
        "    def __init__(self):\n"
        "        self.lock = threading.Lock()   # held by a parent thread at the fork\n"
        "    def __getitem__(self, i):\n"
        "        with self.lock: ...",
        "class Remote(Dataset):\n"
        "    def __getitem__(self, i):\n"
        "        if not hasattr(self, 'lock'):\n"
        "            self.lock = threading.Lock()   # made in each worker\n"
        "        with self.lock: ..."),
        "every supported torch"),
    "DL212": ((
        "class Frames(Dataset):\n"
        "    def __init__(self, path):\n"
        "        self.env = lmdb.open(path, readonly=True)   # used after fork",
        "class Frames(Dataset):\n"
        "    def __init__(self, path):\n"
        "        self.path, self.env = path, None\n"
        "    def __getitem__(self, i):\n"
        "        if self.env is None:\n"
        "            self.env = lmdb.open(self.path, readonly=True)\n"
        "        ..."),
        "every supported torch; fork workers"),
    "DL213": ((
        "# ulimit -n 1024, and a collate_fn that returns many tensors per batch\n"
        "DataLoader(ds, num_workers=8, collate_fn=list_of_tensors)",
        "torch.multiprocessing.set_sharing_strategy('file_system')\n"
        "DataLoader(ds, num_workers=8, collate_fn=list_of_tensors)"),
        "every supported torch, on Linux (file_descriptor sharing)"),
    "DL214": ((
        "# docker run (64 MiB of /dev/shm)\n"
        "DataLoader(images, batch_size=64, num_workers=4)",
        "# docker run --shm-size=2g (or --ipc=host)\n"
        "DataLoader(images, batch_size=64, num_workers=4)"),
        "every supported torch, on Linux (batches travel through /dev/shm)"),
    "DL215": ((
        "# 4 workers x prefetch_factor 4: 16 large batches in flight at once\n"
        "DataLoader(volumes, batch_size=8, num_workers=4, prefetch_factor=4)",
        "DataLoader(volumes, batch_size=8, num_workers=4, prefetch_factor=1)\n"
        "# or fewer workers, smaller samples or batches"),
        "every supported torch"),
    "DL216": ((
        "class Records(Dataset):\n"
        "    def __init__(self, path):\n"
        "        self.fh = open(path, 'rb')   # deleted or replaced before the workers start",
        "class Records(Dataset):\n"
        "    def __init__(self, path):\n"
        "        self.path, self.fh = path, None\n"
        "    def __getitem__(self, i):\n"
        "        if self.fh is None:\n"
        "            self.fh = open(self.path, 'rb')   # opened in each worker\n"
        "        ..."),
        "every supported torch; fork workers (the repairs of DL207 and DL212)"),
    "DL217": ((
        "class Records(Dataset):\n"
        "    def __init__(self, path):\n"
        "        self.fd = os.open(path, os.O_RDONLY)   # a number: spawn workers have no fd\n"
        "    def __getitem__(self, i):\n"
        "        os.lseek(self.fd, i * SIZE, os.SEEK_SET)\n"
        "        return os.read(self.fd, SIZE)",
        "class Records(Dataset):\n"
        "    def __init__(self, path):\n"
        "        self.path, self.fd = path, None\n"
        "    def __getitem__(self, i):\n"
        "        if self.fd is None:\n"
        "            self.fd = os.open(self.path, os.O_RDONLY)   # in each worker\n"
        "        os.lseek(self.fd, i * SIZE, os.SEEK_SET)\n"
        "        return os.read(self.fd, SIZE)"),
        "every supported torch; spawn workers (macOS, Windows) and forkserver workers "
        "(Linux from Python 3.14)"),
    "DL218": ((
        "class Images(Dataset):\n"
        "    def __init__(self, path):\n"
        "        # pickled whole into every spawn worker start\n"
        "        self.images = np.memmap(path, np.uint8, 'r', shape=(N, 3, 224, 224))\n"
        "    def __getitem__(self, i):\n"
        "        return torch.from_numpy(self.images[i].copy())",
        "class Images(Dataset):\n"
        "    def __init__(self, path):\n"
        "        self.path, self.images = path, None\n"
        "    def __getitem__(self, i):\n"
        "        if self.images is None:   # mapped in each worker\n"
        "            self.images = np.memmap(self.path, np.uint8, 'r',\n"
        "                                    shape=(N, 3, 224, 224))\n"
        "        return torch.from_numpy(self.images[i].copy())"),
        "every supported torch; spawn workers (macOS, Windows) and forkserver workers "
        "(Linux from Python 3.14). Maps are found through /proc/self/maps: on macOS and "
        "Windows the memmap is pickled as before"),
    # -- devices, shared memory, open files ----------------------------------------
    "DL301": ((
        "ds = TensorDataset(x.cuda(), y.cuda())\n"
        "DataLoader(ds, num_workers=2)",
        "ds = TensorDataset(x, y)                      # on CPU\n"
        "for xb, yb in DataLoader(ds, num_workers=2, pin_memory=True):\n"
        "    xb, yb = xb.cuda(non_blocking=True), yb.cuda(non_blocking=True)"),
        "every supported torch with an accelerator (CUDA, MPS, XPU)"),
    "DL302": ((
        "ds = ConcatDataset([TensorDataset(a), TensorDataset(b.cuda())])\n"
        "DataLoader(ds, batch_size=8)",
        "ds = ConcatDataset([TensorDataset(a), TensorDataset(b)])   # all on CPU\n"
        "for (xb,) in DataLoader(ds, batch_size=8):\n"
        "    xb = xb.to(device)"),
        "every supported torch with an accelerator"),
    "DL303": ((
        "# docker run (64 MiB of /dev/shm)\n"
        "DataLoader(TensorDataset(images), batch_size=256, num_workers=4)",
        "# docker run --shm-size=2g (or --ipc=host)\n"
        "DataLoader(TensorDataset(images), batch_size=256, num_workers=4)"),
        "every supported torch, on Linux"),
    "DL304": ((
        "# ulimit -n 256\n"
        "DataLoader(TensorDataset(x, y), batch_size=64, num_workers=8)",
        "# ulimit -n 65536 before starting, or:\n"
        "torch.multiprocessing.set_sharing_strategy('file_system')"),
        "every supported torch, on Linux (file_descriptor sharing)"),
    # -- OpenCV ---------------------------------------------------------------------
    "CV401": ((
        "import cv2\n"
        "DataLoader(images_resized_with_cv2, num_workers=4)",
        "import cv2\n\n"
        "def worker_init(worker_id):\n"
        "    cv2.setNumThreads(0)  # 0, never another count, in a forked worker\n\n"
        "DataLoader(images_resized_with_cv2, num_workers=4, worker_init_fn=worker_init)"),
        "every supported torch; any OpenCV (opencv-python, -headless, -contrib)"),
    "CV402": ((
        "import cv2\n"
        "cv2.GaussianBlur(cv2.UMat(image), (5, 5), 0)  # OpenCL in the main process\n"
        "DataLoader(images_blurred_with_umat, num_workers=4)",
        "import multiprocessing\n"
        "import cv2\n\n"
        "def worker_init(worker_id):\n"
        "    cv2.ocl.setUseOpenCL(False)\n\n"
        "DataLoader(images_blurred_with_umat, num_workers=4, worker_init_fn=worker_init,\n"
        "           multiprocessing_context=multiprocessing.get_context('forkserver'))"),
        "every supported torch; OpenCV builds with OpenCL, where an OpenCL device is usable"),
    # -- AMP ------------------------------------------------------------------------
    "AMP501": ((
        "with torch.cuda.amp.autocast(True):\n"
        "    loss = model(x)",
        "with torch.amp.autocast('cuda', enabled=True):\n"
        "    loss = model(x)"),
        "torch 2.4 and later warn (the old names are deprecated); earlier torch has "
        "torch.amp.autocast too"),
    "AMP502": ((
        "scaler = torch.cuda.amp.GradScaler(2.0 ** 16)",
        "scaler = torch.amp.GradScaler('cuda', init_scale=2.0 ** 16)"),
        "torch 2.4 and later warn; torch.amp.GradScaler exists from torch 2.3"),
    "AMP503": ((
        "with torch.autocast('cuda'):       # on a machine without CUDA\n"
        "    loss = model(x)",
        "device = next(model.parameters()).device\n"
        "with torch.autocast(device.type, enabled=device.type == 'cuda'):\n"
        "    loss = model(x)"),
        "every supported torch; torch 2.0 raises for a device type other than cuda "
        "or cpu"),
    "AMP504": ((
        "scaler = torch.cuda.amp.GradScaler(device='cuda')",
        "scaler = torch.amp.GradScaler('cuda')          # torch >= 2.3\n"
        "scaler = torch.cuda.amp.GradScaler()           # older torch"),
        "torch before 2.3 (GradScaler takes no device), and torch.cuda.amp.GradScaler "
        "on every torch"),
    "AMP505": ((
        "with torch.autocast('cpu', dtype=torch.float16):\n"
        "    loss = model(x)",
        "with torch.autocast('cpu', dtype=torch.bfloat16):\n"
        "    loss = model(x)"),
        "any: which device types and dtypes autocast takes is asked of the installed "
        "torch (probed once), not read from its version number"),
    "AMP506": ((
        "scaler = torch.amp.GradScaler('cuda')   # on torch 2.2",
        "scaler = torch.cuda.amp.GradScaler()    # or torch >= 2.3"),
        "torch before 2.3 (no torch.amp.GradScaler)"),
}
