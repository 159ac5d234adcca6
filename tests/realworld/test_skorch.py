"""skorch's NeuralNetClassifier.fit on an HDF5 dataset that opens its file in
__init__ (programs/skorch_h5py.py), 2 workers, random augmentation per worker."""

import numpy as np

from harness import check_no_fix, check_same_losses

PACKAGES = ("skorch", "h5py")
PROGRAM = "skorch_h5py.py"
STEPS = 3  # epochs: skorch keeps the mean loss of each


def make_data(folder):
    """256 16x16 grey images of 4 classes (a bright bar whose place is the class)
    and their labels, in images.h5."""
    import h5py

    rng = np.random.default_rng(27)
    labels = rng.integers(0, 4, size=256)
    images = rng.integers(0, 60, size=(256, 1, 16, 16)).astype(np.uint8)
    for i, label in enumerate(labels):
        images[i, 0, 4 * label:4 * label + 4, 2:14] += 150
    with h5py.File(str(folder / "images.h5"), "w") as f:
        f.create_dataset("images", data=images, chunks=(16, 1, 16, 16))
        f.create_dataset("labels", data=labels.astype(np.int64))


def test_linux_with_the_shim_same_losses(linux, linux_shim):
    check_same_losses(linux_shim, linux)


# On Linux with fork, a program that works gets no fix record: h5py reads with
# pread (no shared file offset), so forked workers are safe as they are.
def test_linux_with_the_shim_no_fix(linux_shim):
    check_no_fix(linux_shim)


def test_as_on_macos_without_the_shim_the_h5py_file_does_not_pickle(macos):
    assert macos.rc != 0 and "h5py objects cannot be pickled" in macos.stderr, macos


def test_as_on_macos_with_the_shim_the_linux_losses(linux, macos_shim):
    check_same_losses(macos_shim, linux)
    codes = [r["code"] for r in macos_shim.fixes() if r["code"] != "DL209"]
    assert codes == ["DL201"], macos_shim  # the file reopened by path in each worker
