"""A dataset whose __setstate__ reads a vocabulary main() built: the value
must be in place before the dataset arrives in a worker."""

import torch
from torch.utils.data import DataLoader, Dataset

from _loop import sample, train

VOCAB = {}


class Tokens(Dataset):
    def __init__(self, words):
        self.words = words
        self.ids = [VOCAB[w] for w in words]

    def __getstate__(self):
        return {"words": self.words}  # the ids are made again where it arrives

    def __setstate__(self, state):
        self.words = state["words"]
        self.ids = [VOCAB.get(w, -1) for w in self.words]

    def __len__(self):
        return len(self.words)

    def __getitem__(self, i):
        return sample(torch.tensor([float(self.ids[i])] * 4))


def main():
    words = ["w%d" % (i % 7) for i in range(24)]
    for k, w in enumerate(sorted(set(words))):
        VOCAB[w] = 100 + k
    torch.manual_seed(0)
    train(DataLoader(Tokens(words), batch_size=4, shuffle=True, num_workers=2))


if __name__ == "__main__":
    main()
