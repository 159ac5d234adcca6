"""Figure 12: what CV401 costs cv2 code, in the program and in its workers.

CV401 leaves the program's own process as it is (its OpenCV threads, OpenCL,
environment) and gives each DataLoader worker ``cv2.setNumThreads(0)``
(a worker_init_fn step, and an after-fork hook for fork workers).

- 12a: a healthy cv2-heavy loop in the main process (``num_workers=0``,
  the seeds' own hand fix): 512x512 images, three GaussianBlur and a
  resize per sample, no training step. OpenCV's threads are its only
  parallelism. Shim off / shim on (Linux, fork), fresh processes, the
  order alternating; each process's fastest of 3 epochs.
- 12b: the same samples made by 2 fork workers (the loader the seeds
  wanted): shim off / on.

``python cv2_threads.py epoch WORKERS`` prints one epoch's time as JSON.
"""

import json
import sys
import time

from common import QUICK, Row, child_env, json_child, median

SIDE, SAMPLES, BATCH, EPOCHS = 512, 384, 16, 3


def epoch(workers):
    import cv2
    import numpy as np
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Blurred(Dataset):
        def __init__(self):
            self.image = np.random.RandomState(0).randint(0, 256, (SIDE, SIDE, 3), np.uint8)

        def __len__(self):
            return SAMPLES

        def __getitem__(self, i):
            img = np.roll(self.image, i, axis=0)
            for _ in range(3):
                img = cv2.GaussianBlur(img, (11, 11), 0)
            return torch.from_numpy(cv2.resize(img, (384, 384)))

    loader = DataLoader(Blurred(), batch_size=BATCH, num_workers=workers)
    times = []
    for _ in range(EPOCHS):  # the fastest epoch: a shared machine's bursts filtered out
        start = time.perf_counter()
        total = sum(int(batch.numpy().sum(dtype=np.int64)) for batch in loader)
        times.append(time.perf_counter() - start)
    print(json.dumps({"epoch_s": min(times), "check": total,
                      "threads": cv2.getNumThreads()}))


def figures():
    reps = 2 if QUICK else 6
    envs = {"off": {"AUTOSAFE_TORCH": "0"}, "on": {"AUTOSAFE_TORCH": "1"}}
    rows = []
    for name, workers in (("12a healthy cv2-heavy loop in the main process (num_workers=0): "
                           "shim off / on", 0),
                          ("12b the same samples from 2 fork workers: shim off / on", 2)):
        runs = {k: [] for k in envs}
        for r in range(reps):
            for key in (("off", "on") if r % 2 == 0 else ("on", "off")):
                env = child_env(dict(envs[key], AUTOSAFE_TORCH_QUIET="1"))
                runs[key].append(json_child([__file__, "epoch", str(workers)], env,
                                            timeout=300))
        same = len({r["check"] for v in runs.values() for r in v}) == 1
        ratios = [a["epoch_s"] / b["epoch_s"] for a, b in zip(runs["off"], runs["on"])]
        note = "epoch (median): shim off %.2f s, on %.2f s; the program's cv2 threads: off " \
            "%s, on %s; the same images in every run: %s" % (
                median([r["epoch_s"] for r in runs["off"]]),
                median([r["epoch_s"] for r in runs["on"]]), runs["off"][0]["threads"],
                runs["on"][0]["threads"], "yes" if same else "NO")
        if workers:
            note += ". Workers: setNumThreads(0) with the shim, OpenCV's default without"
        rows.append(Row(12, name, 0.98, "ge", "x", ratios, note))
    return rows


if __name__ == "__main__":
    epoch(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
