"""main() changes the config before each epoch (a curriculum). Fork's
semantics: a worker has the values of its iterator's start; persistent
workers (``persistent`` on the command line) keep their first start's."""

import sys

import torch
from torch.utils.data import DataLoader, Dataset

from _loop import sample, train

CONFIG = {"difficulty": 0}


class Curriculum(Dataset):
    def __len__(self):
        return 24

    def __getitem__(self, i):
        return sample(torch.full((4,), float(i + 100 * CONFIG["difficulty"])))


def harder(epoch):
    CONFIG["difficulty"] = epoch + 1


def main():
    persistent = sys.argv[1:] == ["persistent"]
    torch.manual_seed(0)
    train(DataLoader(Curriculum(), batch_size=4, shuffle=True, num_workers=2,
                     persistent_workers=persistent), before_epoch=harder)


if __name__ == "__main__":
    main()
