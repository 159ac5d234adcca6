"""A library function replaced in main() (a monkeypatch) that __getitem__ calls:
by a function of the script, or (``lambda`` on the command line) by a lambda,
which a worker cannot import."""

import colorsys
import sys

import torch
from torch.utils.data import DataLoader, Dataset

from _loop import sample, train

_fractions = colorsys.rgb_to_hsv


def rgb_to_hsv_degrees(r, g, b):
    h, s, v = _fractions(r, g, b)
    return h * 360.0, s, v  # the hue in degrees, as the rest of the program has it


class Pixels(Dataset):
    def __len__(self):
        return 24

    def __getitem__(self, i):
        h, s, v = colorsys.rgb_to_hsv((i % 5) / 5, (i % 3) / 3, (i % 7) / 7)
        return sample(torch.tensor([h, s, v, float(i)]))


def main():
    colorsys.rgb_to_hsv = rgb_to_hsv_degrees if sys.argv[1:] != ["lambda"] else \
        (lambda r, g, b: tuple(x * 2.0 for x in _fractions(r, g, b)))
    torch.manual_seed(0)
    train(DataLoader(Pixels(), batch_size=4, shuffle=True, num_workers=2))


if __name__ == "__main__":
    main()
