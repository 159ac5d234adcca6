"""torch's default dtype set in main(), a library-wide setting a new
interpreter resets: the dataset's tensors are float64 under fork."""

import torch
from torch.utils.data import DataLoader, Dataset

from _loop import sample, train


class Ratios(Dataset):
    def __len__(self):
        return 24

    def __getitem__(self, i):
        return sample(torch.tensor([i / 3, i / 7, i / 11, 1 / (i + 1)]))


def main():
    torch.set_default_dtype(torch.float64)
    torch.manual_seed(0)
    train(DataLoader(Ratios(), batch_size=4, shuffle=True, num_workers=2))


if __name__ == "__main__":
    main()
