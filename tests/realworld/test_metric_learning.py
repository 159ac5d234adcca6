"""pytorch-metric-learning's MetricLossOnly trainer on PNG images read with
OpenCV and augmented by albumentations (programs/pml_albumentations.py), 2
workers each augmenting with its own seed; a lambda in the pipeline."""

import numpy as np

from harness import CV2_CODES, check_no_fix, check_same_losses

PACKAGES = ("pytorch_metric_learning", "albumentations", "cv2")
PROGRAM = "pml_albumentations.py"
STEPS = 12  # 2 epochs of 6 batches


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


def test_linux_with_the_shim_same_losses_no_fix(linux, linux_shim):
    check_same_losses(linux_shim, linux)
    check_no_fix(linux_shim, allowed=CV2_CODES)


def test_as_on_macos_without_the_shim_the_lambda_does_not_pickle(macos):
    assert macos.rc != 0 and "Can't pickle <function <lambda>" in macos.stderr, macos


def test_as_on_macos_with_the_shim_the_linux_losses(linux, macos_shim):
    check_same_losses(macos_shim, linux)
    assert "DL202" in [r["code"] for r in macos_shim.fixes()], macos_shim  # by value
