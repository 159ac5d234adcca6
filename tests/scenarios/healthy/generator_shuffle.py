"""shuffle=True with the loader's own generator=: the order and the workers'
base seed come from that generator, not from torch's global one."""

import torch
from torch.utils.data import DataLoader, Dataset

from _common import digest, finish, fingerprint, num_workers, record_warnings, seed_all, state


class Augmented(Dataset):
    def __len__(self):
        return 14

    def __getitem__(self, idx):
        return idx, torch.rand(2)


def main():
    record_warnings()
    seed_all(13)
    generator = torch.Generator().manual_seed(7)
    loader = DataLoader(Augmented(), batch_size=4, shuffle=True, num_workers=num_workers(),
                        generator=generator)
    state("num_workers", loader.num_workers)
    digest(loader, epochs=2)
    state("loader_generator", fingerprint(generator.get_state().numpy().tobytes()))
    finish()


if __name__ == "__main__":
    main()
