"""OpenCV in DataLoader workers: each sample says how many threads and
whether OpenCL its worker's cv2 has. Forked workers inherit OpenCV's
thread pool (the classic hang in cv2.resize), spawned ones start their own.
"""

import hashlib

import cv2
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset


class Blurred(Dataset):
    def __len__(self):
        return 12

    def __getitem__(self, i):
        image = np.full((16, 16), i, dtype=np.float32)
        blurred = cv2.GaussianBlur(image, (3, 3), 0)
        return torch.tensor([float(blurred.sum()), cv2.getNumThreads(),
                             float(cv2.ocl.useOpenCL())])


def main():
    loader = DataLoader(Blurred(), batch_size=3, num_workers=2)
    h = hashlib.sha256()
    for batch in loader:
        h.update(batch.numpy().tobytes())
    print("PARENT", cv2.getNumThreads(), cv2.ocl.useOpenCL(), flush=True)
    print("BATCHES", h.hexdigest(), flush=True)


if __name__ == "__main__":
    main()
