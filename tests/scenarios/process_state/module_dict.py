"""A module-level config filled from the command line in main(), read by __getitem__."""

import argparse

import torch
from torch.utils.data import DataLoader, Dataset

from _loop import sample, train

CONFIG = {"scale": 1.0, "offset": 0.0}


class Readings(Dataset):
    def __len__(self):
        return 24

    def __getitem__(self, i):
        x = torch.arange(4, dtype=torch.float32) + i
        return sample(x * CONFIG["scale"] + CONFIG["offset"] + torch.rand(4))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--scale", type=float, default=3.0)
    parser.add_argument("--offset", type=float, default=-1.0)
    CONFIG.update(vars(parser.parse_args()))
    torch.manual_seed(0)
    train(DataLoader(Readings(), batch_size=4, shuffle=True, num_workers=2))


if __name__ == "__main__":
    main()
