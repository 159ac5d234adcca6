"""A dataset that owns a numpy.random.Generator for its augmentation.

Each worker gets its own copy of the generator as it stood when the workers
started; a single draw from it anywhere else before then (in the parent)
changes every batch. The parent's generator is printed after the run.
"""

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from _common import digest, finish, fingerprint, num_workers, record_warnings, seed_all, state


class OwnsGenerator(Dataset):
    def __init__(self):
        self.rng = np.random.default_rng(1234)

    def __len__(self):
        return 16

    def __getitem__(self, idx):
        return idx, torch.from_numpy(self.rng.random(3))


def main():
    record_warnings()
    seed_all(8)
    dataset = OwnsGenerator()
    before = fingerprint(dataset.rng.bit_generator.state)
    loader = DataLoader(dataset, batch_size=4, num_workers=num_workers())
    state("num_workers", loader.num_workers)
    digest(loader, epochs=2)
    state("parent_generator_untouched", fingerprint(dataset.rng.bit_generator.state) == before)
    state("parent_generator", fingerprint(dataset.rng.bit_generator.state))
    finish()


if __name__ == "__main__":
    main()
