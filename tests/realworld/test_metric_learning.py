"""pytorch-metric-learning's MetricLossOnly trainer on PNG images read with
OpenCV and augmented by albumentations (programs/pml_albumentations.py), 2
workers each augmenting with its own seed; a lambda in the pipeline."""

import numpy as np
import pytest

from harness import CV2_CODES, check_linux_shim, check_macos_shim, run

PACKAGES = ("pytorch_metric_learning", "albumentations", "cv2")
PROGRAM = "pml_albumentations.py"


def make_data(folder):
    """images/<class>/<n>.png: 8 classes of 24 32x32 images (a coloured disc or
    square, its place jittered, on noise), written with OpenCV."""
    import cv2

    rng = np.random.default_rng(27)
    colours = [(230, 40, 40), (40, 230, 40), (40, 40, 230), (230, 230, 40)]
    for label in range(8):
        folder_c = folder / "images" / ("class%d" % label)
        folder_c.mkdir(parents=True)
        for n in range(24):
            image = rng.integers(0, 50, size=(32, 32, 3)).astype(np.uint8)
            x, y = (int(v) for v in rng.integers(10, 22, size=2))
            colour = colours[label % 4]
            if label < 4:
                cv2.circle(image, (x, y), 7, colour, -1)
            else:
                cv2.rectangle(image, (x - 6, y - 6), (x + 6, y + 6), colour, -1)
            assert cv2.imwrite(str(folder_c / ("%02d.png" % n)), image)


@pytest.fixture(scope="module")
def linux(tmp_path_factory):
    """Data, and the plain Linux run (fork, no shim): the reference losses."""
    folder = tmp_path_factory.mktemp("metric_learning")
    make_data(folder)
    plain = run(folder, PROGRAM, "linux", [folder])
    assert plain.rc == 0 and plain.losses and len(plain.losses) == 12, plain
    return folder, plain


def test_linux_with_the_shim_same_losses_no_fix(linux):
    folder, plain = linux
    check_linux_shim(run(folder, PROGRAM, "linux-shim", [folder]), plain, allowed=CV2_CODES)


def test_as_on_macos_without_the_shim_the_lambda_does_not_pickle(linux):
    folder, _ = linux
    mac = run(folder, PROGRAM, "macos", [folder])
    assert mac.rc != 0 and "<lambda>" in mac.stderr, mac


def test_as_on_macos_with_the_shim_the_linux_losses(linux):
    folder, plain = linux
    shim = run(folder, PROGRAM, "macos-shim", [folder])
    check_macos_shim(shim, plain)
    assert "DL202" in [r["code"] for r in shim.fixes()], shim
