"""MONAI: a small 2D UNet trained for segmentation by MONAI's SupervisedTrainer
(an ignite engine), on images and masks in .npy files loaded and augmented by
MONAI's dictionary transforms (random flips, rotations, noise: each transform
keeps its own RNG, which MONAI's DataLoader seeds in every worker).

Written as a script runs from top to bottom, without an
``if __name__ == "__main__":`` guard: fine where workers fork (Linux); a spawned
worker (macOS) imports this file again and starts the training anew, which
multiprocessing refuses ("before the current process has finished its
bootstrapping phase").

Prints ``LOSSES [...]``: the loss of every iteration, exact (repr).
"""

import glob
import os
import sys

import torch
from ignite.engine import Events
from monai.data import DataLoader, Dataset
from monai.engines import SupervisedTrainer
from monai.losses import DiceLoss
from monai.networks.nets import UNet
from monai.transforms import (Compose, EnsureChannelFirstd, EnsureTyped, LoadImaged,
                              RandFlipd, RandGaussianNoised, RandRotate90d, ScaleIntensityd)
from monai.utils import CommonKeys, set_determinism

data_dir = sys.argv[1]
set_determinism(seed=0)

images = sorted(glob.glob(os.path.join(data_dir, "img*.npy")))
segs = sorted(glob.glob(os.path.join(data_dir, "seg*.npy")))
train_files = [{"image": img, "label": seg} for img, seg in zip(images, segs)]

train_transforms = Compose([
    LoadImaged(keys=["image", "label"], reader="NumpyReader"),
    EnsureChannelFirstd(keys=["image", "label"], channel_dim="no_channel"),
    ScaleIntensityd(keys="image"),
    RandFlipd(keys=["image", "label"], prob=0.5, spatial_axis=0),
    RandRotate90d(keys=["image", "label"], prob=0.5, spatial_axes=(0, 1)),
    RandGaussianNoised(keys="image", prob=0.5, std=0.05),
    EnsureTyped(keys=["image", "label"], track_meta=False),
])
train_ds = Dataset(data=train_files, transform=train_transforms)
train_loader = DataLoader(train_ds, batch_size=8, shuffle=True, num_workers=2)

net = UNet(spatial_dims=2, in_channels=1, out_channels=1, channels=(4, 8, 16),
           strides=(2, 2), num_res_units=1)
trainer = SupervisedTrainer(
    device=torch.device("cpu"),
    max_epochs=3,
    train_data_loader=train_loader,
    network=net,
    optimizer=torch.optim.Adam(net.parameters(), 1e-2),
    loss_function=DiceLoss(sigmoid=True),
    decollate=False,
)

step_losses = []


@trainer.on(Events.ITERATION_COMPLETED)
def keep_loss(engine):
    step_losses.append(engine.state.output[CommonKeys.LOSS].item())


trainer.run()
print("LOSSES", repr(step_losses), flush=True)
