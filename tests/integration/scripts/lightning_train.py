"""A Lightning training script: a LightningModule with its own train and
predict loaders, 2 epochs on the CPU. Prints a sha256 over every batch the
model saw (BATCHES) and the predictions (PREDICT)."""

import hashlib

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

NUM_WORKERS = 2


class Squares(Dataset):
    def __init__(self, n=48):
        g = torch.Generator().manual_seed(0)
        self.x = torch.rand(n, 4, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        x = self.x[i]
        return x, (x ** 2).sum(0, keepdim=True)


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(4, 1)
        self.seen = hashlib.sha256()

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.seen.update(x.numpy().tobytes())
        return torch.nn.functional.mse_loss(self.net(x), y)

    def predict_step(self, batch, batch_idx):
        return self.net(batch[0])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return DataLoader(Squares(), batch_size=8, shuffle=True, num_workers=NUM_WORKERS)

    def predict_dataloader(self):
        return DataLoader(Squares(16), batch_size=8, num_workers=NUM_WORKERS)


def main():
    L.seed_everything(0)
    model = Model()
    trainer = L.Trainer(max_epochs=2, accelerator="cpu", devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(model)
    print("BATCHES", model.seen.hexdigest(), flush=True)
    predictions = trainer.predict(model)
    print("PREDICT", hashlib.sha256(torch.cat(predictions).numpy().tobytes()).hexdigest())


if __name__ == "__main__":
    main()
