"""MONAI's SupervisedTrainer with its dictionary transforms and DataLoader
(programs/monai_segmentation.py): 2D segmentation from .npy files, 2 workers,
random augmentation seeded per transform in each worker; a script without a
``__main__`` guard."""

import numpy as np
import pytest

from harness import CV2_CODES, check_linux_shim, check_macos_shim, run

PACKAGES = ("monai", "ignite")
PROGRAM = "monai_segmentation.py"


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


@pytest.fixture(scope="module")
def linux(tmp_path_factory):
    """Data, and the plain Linux run (fork, no shim): the reference losses."""
    folder = tmp_path_factory.mktemp("monai")
    make_data(folder)
    plain = run(folder, PROGRAM, "linux", [folder])
    assert plain.rc == 0 and plain.losses and len(plain.losses) == 15, plain
    return folder, plain


def test_linux_with_the_shim_same_losses_no_fix(linux):
    folder, plain = linux
    check_linux_shim(run(folder, PROGRAM, "linux-shim", [folder]), plain, allowed=CV2_CODES)


def test_as_on_macos_without_the_shim_the_unguarded_script_fails(linux):
    folder, _ = linux
    mac = run(folder, PROGRAM, "macos", [folder])
    assert mac.rc != 0 and "bootstrapping phase" in mac.stderr, mac


def test_as_on_macos_with_the_shim_the_linux_losses(linux):
    folder, plain = linux
    shim = run(folder, PROGRAM, "macos-shim", [folder])
    check_macos_shim(shim, plain)
    assert "DL204" in [r["code"] for r in shim.fixes()], shim
