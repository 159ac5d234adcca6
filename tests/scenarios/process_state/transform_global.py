"""A transform object whose __call__ reads a module global that main() sets."""

import torch
from torch.utils.data import DataLoader, Dataset

from _loop import sample, train

JITTER = 0.0


class Jitter:
    def __call__(self, x):
        return x + JITTER * torch.randn_like(x)


class Compose:
    def __init__(self, transforms):
        self.transforms = transforms

    def __call__(self, x):
        for t in self.transforms:
            x = t(x)
        return x


class Images(Dataset):
    def __init__(self, transform):
        self.transform = transform

    def __len__(self):
        return 24

    def __getitem__(self, i):
        return sample(self.transform(torch.full((4,), float(i))))


def main():
    global JITTER
    JITTER = 0.5
    torch.manual_seed(0)
    train(DataLoader(Images(Compose([Jitter()])), batch_size=4, shuffle=True, num_workers=2))


if __name__ == "__main__":
    main()
