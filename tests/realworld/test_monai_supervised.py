"""MONAI's SupervisedTrainer with its dictionary transforms and DataLoader
(programs/monai_segmentation.py): 2D segmentation from .npy files, 2 workers,
random augmentation seeded per transform in each worker; a script without a
``__main__`` guard."""

import numpy as np

from harness import CV2_CODES, check_no_fix, check_same_losses

PACKAGES = ("monai", "ignite")
PROGRAM = "monai_segmentation.py"
STEPS = 15  # 3 epochs of 5 batches


def make_data(folder):
    """img00.npy..img39.npy: 32x32 noisy images of a bright disc;
    seg00.npy..: its mask."""
    rng = np.random.default_rng(27)
    yy, xx = np.mgrid[:32, :32]
    for n in range(40):
        cy, cx = rng.integers(8, 24, size=2)
        radius = rng.integers(4, 8)
        mask = ((yy - cy) ** 2 + (xx - cx) ** 2 <= radius ** 2).astype(np.float32)
        image = (mask * 0.7 + rng.normal(0.2, 0.1, size=(32, 32))).astype(np.float32)
        np.save(str(folder / ("img%02d.npy" % n)), image)
        np.save(str(folder / ("seg%02d.npy" % n)), mask)


def test_linux_with_the_shim_same_losses_no_fix(linux, linux_shim):
    check_same_losses(linux_shim, linux)
    check_no_fix(linux_shim, allowed=CV2_CODES)


def test_as_on_macos_without_the_shim_the_unguarded_script_fails(macos):
    assert macos.rc != 0 and "bootstrapping phase" in macos.stderr, macos


def test_as_on_macos_with_the_shim_the_linux_losses(linux, macos_shim):
    check_same_losses(macos_shim, linux)
    assert "DL204" in [r["code"] for r in macos_shim.fixes()], macos_shim  # emulated workers
