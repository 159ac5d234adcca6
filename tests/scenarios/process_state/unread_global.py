"""Control: main() changes globals no worker reads (one only main() reads, one
only a method no worker calls); the dataset carries its own state."""

import torch
from torch.utils.data import DataLoader, Dataset

from _loop import sample, train

VERBOSE = False
REPORT_TITLE = "readings"


class Readings(Dataset):
    def __init__(self, scale):
        self.scale = scale

    def __len__(self):
        return 24

    def __getitem__(self, i):
        return sample(torch.arange(4.0) * self.scale + torch.rand(4))

    def describe(self):  # called by main(), never in a worker
        return "%s x%s" % (REPORT_TITLE, self.scale)


def main():
    global VERBOSE, REPORT_TITLE
    VERBOSE, REPORT_TITLE = True, "spectra"
    dataset = Readings(2.5)
    if VERBOSE:
        print("DESCRIBE", dataset.describe())
    torch.manual_seed(0)
    train(DataLoader(dataset, batch_size=4, shuffle=True, num_workers=2))


if __name__ == "__main__":
    main()
