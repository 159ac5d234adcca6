"""skorch: a small CNN classifier trained with NeuralNetClassifier.fit on an
HDF5 file of images, as a skorch user writes it.

The dataset opens the HDF5 file in __init__ and keeps the h5py.File (the
legacy habit: fine with fork on Linux; h5py objects cannot be pickled, so
spawn workers, macOS's default, fail). Each sample is augmented at random
(flip, shift, noise) with torch's RNG, seeded per DataLoader worker.

Prints ``LOSSES [...]``: skorch's train_loss per epoch, exact (repr).
"""

import os
import sys

import h5py
import numpy as np
import torch
from torch import nn
from skorch import NeuralNetClassifier


class H5Images(torch.utils.data.Dataset):
    def __init__(self, path):
        self.h5 = h5py.File(path, "r")
        self.images = self.h5["images"]
        self.labels = self.h5["labels"]

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        image = torch.from_numpy(self.images[index].astype(np.float32) / 255.0)
        if torch.rand(()) < 0.5:
            image = image.flip(-1)
        shift = int(torch.randint(-2, 3, ()))
        image = torch.roll(image, shift, dims=-2)
        image = image + 0.05 * torch.randn_like(image)
        return image, int(self.labels[index])


class SmallCNN(nn.Module):
    def __init__(self, classes=4):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Linear(16 * 4 * 4, classes)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


def main(data_dir):
    torch.manual_seed(0)
    dataset = H5Images(os.path.join(data_dir, "images.h5"))
    net = NeuralNetClassifier(
        SmallCNN,
        criterion=nn.CrossEntropyLoss,
        optimizer=torch.optim.Adam,
        lr=0.01,
        max_epochs=3,
        batch_size=32,
        train_split=None,
        iterator_train__shuffle=True,
        iterator_train__num_workers=2,
        verbose=0,
        device="cpu",
    )
    net.fit(dataset, y=None)
    print("LOSSES", repr([float(loss) for loss in net.history[:, "train_loss"]]), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
