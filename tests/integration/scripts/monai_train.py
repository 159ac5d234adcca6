"""A MONAI pipeline: dictionary samples, random transforms, a Dataset and a
CacheDataset, MONAI's DataLoader (2 workers) and ThreadDataLoader, 2 epochs.
Prints a sha256 over every batch of both loaders (BATCHES)."""

import hashlib

import torch
from monai.data import CacheDataset, DataLoader, Dataset, ThreadDataLoader
from monai.transforms import Compose, Lambdad, RandFlipd, RandGaussianNoised, ScaleIntensityd
from monai.utils import set_determinism


def invert(x):
    return 1 - x


def samples(n=24):
    g = torch.Generator().manual_seed(0)
    return [{"image": torch.rand(1, 8, 8, generator=g), "label": i % 2} for i in range(n)]


def main():
    set_determinism(seed=0)
    transform = Compose([
        ScaleIntensityd(keys="image"),
        Lambdad(keys="image", func=invert),
        RandFlipd(keys="image", prob=0.5, spatial_axis=0),
        RandGaussianNoised(keys="image", prob=0.5, std=0.1),
    ])
    seen = hashlib.sha256()
    train = DataLoader(Dataset(samples(), transform=transform), batch_size=4, shuffle=True,
                       num_workers=2)
    cached = ThreadDataLoader(CacheDataset(samples(), transform=transform, progress=False),
                              batch_size=4, num_workers=0)
    for _epoch in range(2):
        for loader in (train, cached):
            for batch in loader:
                seen.update(batch["image"].numpy().tobytes())
                seen.update(batch["label"].numpy().tobytes())
    print("BATCHES", seen.hexdigest(), flush=True)


if __name__ == "__main__":
    main()
