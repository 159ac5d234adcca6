"""pytorch-metric-learning: an embedding trained with its MetricLossOnly trainer
(triplet loss, a multi-similarity miner, an M-per-class sampler) on PNG images
read with OpenCV and augmented by albumentations, as its examples write it.

The augmentation pipeline holds a lambda at module level (A.Lambda): pickle
finds no ``__main__.<lambda>``, so spawn workers (macOS) cannot receive the
dataset; forked workers (Linux) never pickle it. Each worker reseeds the
pipeline from its own seed, so that workers augment differently.

Prints ``LOSSES [...]``: the metric loss of every iteration, exact (repr).
"""

import os
import sys

import albumentations as A
import cv2
import numpy as np
import torch
from albumentations.pytorch import ToTensorV2
from pytorch_metric_learning import losses, miners, samplers, trainers
from torch import nn

to_unit_range = lambda image, **kwargs: image.astype(np.float32) / 255.0  # noqa: E731

TRANSFORM = A.Compose([
    A.HorizontalFlip(p=0.5),
    A.Affine(translate_percent=0.1, rotate=(-15, 15), p=0.8),
    A.RandomBrightnessContrast(p=0.5),
    A.Lambda(image=to_unit_range, name="to_unit_range"),
    ToTensorV2(),
], seed=137)


class ImageFolder(torch.utils.data.Dataset):
    """<root>/<class>/<name>.png, read with cv2 when fetched."""

    def __init__(self, root, transform):
        self.classes = sorted(os.listdir(root))
        self.items = [(os.path.join(root, c, name), label)
                      for label, c in enumerate(self.classes)
                      for name in sorted(os.listdir(os.path.join(root, c)))]
        self.labels = [label for _, label in self.items]
        self.transform = transform
        self.seeded_for = None

    def __len__(self):
        return len(self.items)

    def __getitem__(self, index):
        info = torch.utils.data.get_worker_info()
        if info is not None and self.seeded_for != info.seed:
            self.transform.set_random_seed(info.seed % 2**32)  # each worker its own stream
            self.seeded_for = info.seed
        path, label = self.items[index]
        image = cv2.cvtColor(cv2.imread(path), cv2.COLOR_BGR2RGB)
        return self.transform(image=image)["image"], label


def main(data_dir):
    np.random.seed(0)
    torch.manual_seed(0)
    dataset = ImageFolder(os.path.join(data_dir, "images"), TRANSFORM)
    trunk = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten())
    embedder = nn.Linear(16, 8)
    step_losses = []

    def keep_loss(trainer):
        step_losses.append(trainer.losses["metric_loss"].item())

    trainer = trainers.MetricLossOnly(
        models={"trunk": trunk, "embedder": embedder},
        optimizers={"trunk_optimizer": torch.optim.Adam(trunk.parameters(), lr=1e-3),
                    "embedder_optimizer": torch.optim.Adam(embedder.parameters(), lr=1e-3)},
        batch_size=32,
        loss_funcs={"metric_loss": losses.TripletMarginLoss(margin=0.1)},
        mining_funcs={"tuple_miner": miners.MultiSimilarityMiner(epsilon=0.1)},
        dataset=dataset,
        sampler=samplers.MPerClassSampler(dataset.labels, m=4,
                                          length_before_new_iter=len(dataset)),
        dataloader_num_workers=2,
        end_of_iteration_hook=keep_loss,
    )
    trainer.train(num_epochs=2)
    print("LOSSES", repr(step_losses), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
