"""Figure 12: what CV401 costs a script that never forks, and why it stays on Linux.

Where workers may be forked (Linux), CV401 sets ``cv2.setNumThreads(0)`` in
the program's own process when it imports cv2: a forked DataLoader worker
must not inherit a running pool (the seeds' hang), and the import is the one
moment no other thread of the program can be inside a cv2 call. On macOS
and Windows no worker is forked, and the program keeps its threads.

- 12a, 12b: a healthy cv2-heavy loop with ``num_workers=0`` (the seeds' own
  hand fix): 512x512 images, three GaussianBlur and a resize per sample, no
  training step; shim off / shim on, on Linux and as on macOS, in fresh
  processes, the order rotating. With no workers, OpenCV's threads are this
  loop's only parallelism.
- 12c: the alternative, pausing the pool only while fork workers start
  (``setNumThreads(0)`` before, the old count after): with two threads of
  the program running cv2 calls, as a loader built while a thread
  pre-processes would meet it. Runs that die (SIGFPE inside OpenCV) / runs.

``python cv2_threads.py epoch`` prints one epoch's time as JSON;
``python cv2_threads.py pause SECONDS`` pauses and resumes the pool every
60 ms for SECONDS while two threads blur and resize.
"""

import json
import subprocess
import sys
import time

from common import QUICK, Row, child_env, json_child, median

SIDE, SAMPLES, BATCH = 512, 384, 16


def epoch():
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

    loader = DataLoader(Blurred(), batch_size=BATCH, num_workers=0)
    start = time.perf_counter()
    total = sum(int(batch.numpy().sum(dtype=np.int64)) for batch in loader)
    print(json.dumps({"epoch_s": time.perf_counter() - start, "check": total,
                      "threads": cv2.getNumThreads()}))


def pause(seconds):
    import threading

    import cv2
    import numpy as np

    img = np.random.RandomState(0).rand(1500, 1500).astype(np.float32)
    stop = threading.Event()

    def busy():
        while not stop.is_set():
            cv2.resize(img, (1000, 1000))
            cv2.GaussianBlur(img, (15, 15), 0)

    threads = [threading.Thread(target=busy, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    count, end, pauses = cv2.getNumThreads(), time.monotonic() + seconds, 0
    while time.monotonic() < end:
        cv2.setNumThreads(0)   # before the fork ...
        time.sleep(0.01)
        cv2.setNumThreads(count)  # ... and after
        time.sleep(0.05)
        pauses += 1
    stop.set()
    print(json.dumps({"pauses": pauses}))


def figures():
    reps = 2 if QUICK else 6
    envs = {"off": {"AUTOSAFE_TORCH": "0"}, "linux": {"AUTOSAFE_TORCH": "1"},
            "macos": {"AUTOSAFE_TORCH": "1", "AUTOSAFE_TORCH_AS": "macos"}}
    runs = {k: [] for k in envs}
    for r in range(reps):
        order = list(envs)[r % 3:] + list(envs)[:r % 3]
        for key in order:
            env = child_env(dict(envs[key], AUTOSAFE_TORCH_QUIET="1"))
            runs[key].append(json_child([__file__, "epoch"], env, timeout=300))
    same = len({r["check"] for v in runs.values() for r in v}) == 1

    def ratios(key):
        return [a["epoch_s"] / b["epoch_s"] for a, b in zip(runs["off"], runs[key])]

    def times(key):
        return "%.2f s (cv2 threads %s)" % (median([r["epoch_s"] for r in runs[key]]),
                                            runs[key][0]["threads"])

    died, tries = 0, 2 if QUICK else 5
    for _ in range(tries):
        proc = subprocess.run([sys.executable, __file__, "pause", "3"], env=child_env(
            {"AUTOSAFE_TORCH": "0"}), capture_output=True, text=True, timeout=120)
        died += proc.returncode != 0
    note = "epoch (median): shim off %s, on Linux %s, as on macOS %s; the same images in " \
        "every run: %s" % (times("off"), times("linux"), times("macos"), "yes" if same else "NO")
    return [
        Row(12, "12a healthy cv2-heavy loop, num_workers=0, on Linux: shim off / on", 0.98,
            "ge", "x", ratios("linux"), note + ". CV401 stops the pool at the import where "
            "workers may be forked: the only safe moment (12c)."),
        Row(12, "12b the same, as on macOS (no worker is forked): shim off / on", 0.98, "ge",
            "x", ratios("macos"), "the program keeps OpenCV's threads; workers get "
            "setNumThreads(0) from their worker_init_fn step."),
        Row(12, "12c pausing OpenCV's pool around forks instead: runs that die / runs", None,
            None, "", [died / tries], "%d of %d runs of 3 s died (SIGFPE inside OpenCV) while "
            "two threads of the program ran cv2 calls: OpenCV's thread count cannot be "
            "changed safely while another thread is inside cv2, and the shim cannot know "
            "that none is, except at the import." % (died, tries)),
    ]


if __name__ == "__main__":
    if sys.argv[1] == "epoch":
        epoch()
    else:
        pause(float(sys.argv[2]))
