"""skorch's NeuralNetClassifier.fit on an HDF5 dataset that opens its file in
__init__ (programs/skorch_h5py.py), 2 workers, random augmentation per worker."""

import numpy as np
import pytest

from harness import check_linux_shim, check_macos_shim, run

PACKAGES = ("skorch", "h5py")
PROGRAM = "skorch_h5py.py"


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


@pytest.fixture(scope="module")
def linux(tmp_path_factory):
    """Data, and the plain Linux run (fork, no shim): the reference losses."""
    folder = tmp_path_factory.mktemp("skorch")
    make_data(folder)
    plain = run(folder, PROGRAM, "linux", [folder])
    assert plain.rc == 0 and plain.losses and len(plain.losses) == 3, plain
    return folder, plain


# The spec: on Linux with fork, a program that works gets no fix record. h5py reads
# with pread (no shared file offset), so forked workers are safe as they are; the
# shim reopens the file in each worker all the same and records DL207 "fixed"
# (the losses stay the same). Kept as the spec says, for the package to meet.
@pytest.mark.xfail(strict=True, reason="DL207 records a fix for h5py under fork, where "
                   "plain fork is safe (h5py reads with pread: no shared offset)")
def test_linux_with_the_shim_same_losses_no_fix(linux):
    folder, plain = linux
    check_linux_shim(run(folder, PROGRAM, "linux-shim", [folder]), plain)


def test_as_on_macos_without_the_shim_the_h5py_file_does_not_pickle(linux):
    folder, _ = linux
    mac = run(folder, PROGRAM, "macos", [folder])
    assert mac.rc != 0 and "h5py objects cannot be pickled" in mac.stderr, mac


def test_as_on_macos_with_the_shim_the_linux_losses(linux):
    folder, plain = linux
    shim = run(folder, PROGRAM, "macos-shim", [folder])
    check_macos_shim(shim, plain)
    assert [r["code"] for r in shim.fixes() if r["code"] != "DL209"] == ["DL201"], shim
