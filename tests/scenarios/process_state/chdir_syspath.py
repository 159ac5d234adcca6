"""Control: main() changes the working directory and sys.path, which spawn
already carries: the dataset opens a relative path and imports a plugin."""

import os
import sys

import torch
from torch.utils.data import DataLoader, Dataset

from _loop import sample, train


class Plugged(Dataset):
    def __len__(self):
        return 24

    def __getitem__(self, i):
        import scale_plugin  # found on the sys.path main() extended

        with open("values.txt") as f:  # relative to the directory main() moved to
            base = float(f.read())
        return sample(torch.full((4,), base + scale_plugin.FACTOR * i))


def main():
    root = os.path.join(os.environ.get("SCENARIO_TMP", "."), "data")
    os.makedirs(os.path.join(root, "plugins"), exist_ok=True)
    with open(os.path.join(root, "values.txt"), "w") as f:
        f.write("0.25")
    with open(os.path.join(root, "plugins", "scale_plugin.py"), "w") as f:
        f.write("FACTOR = 7.0\n")
    os.chdir(root)
    sys.path.insert(0, os.path.join(root, "plugins"))
    torch.manual_seed(0)
    train(DataLoader(Plugged(), batch_size=4, shuffle=True, num_workers=2))


if __name__ == "__main__":
    main()
