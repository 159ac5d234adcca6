"""transformers: a tiny BERT trained for masked language modelling by Trainer,
with DataCollatorForLanguageModeling (random masking in the DataLoader
workers, seeded per worker), as the library's examples write it, on a text
file and a tokenizer of its own (tokenizer.json; nothing from the Hub).

Prints ``LOSSES [...]``: the loss of every training step, exact (repr).
"""

import os
import sys

import torch
from transformers import (BertConfig, BertForMaskedLM, DataCollatorForLanguageModeling,
                          PreTrainedTokenizerFast, Trainer, TrainingArguments)


class LineByLineText(torch.utils.data.Dataset):
    """One example per line of a text file, tokenized when fetched."""

    def __init__(self, tokenizer, path, block_size=24):
        with open(path, encoding="utf-8") as f:
            self.lines = [line.strip() for line in f if line.strip()]
        self.tokenizer = tokenizer
        self.block_size = block_size

    def __len__(self):
        return len(self.lines)

    def __getitem__(self, i):
        return self.tokenizer(self.lines[i], truncation=True, max_length=self.block_size)


class LossRecordingTrainer(Trainer):
    """Trainer, keeping each step's loss unrounded (its logs round them)."""

    step_losses = []

    def compute_loss(self, model, inputs, *args, **kwargs):
        loss = super().compute_loss(model, inputs, *args, **kwargs)
        value = loss[0] if isinstance(loss, tuple) else loss
        self.step_losses.append(value.detach().item())
        return loss


def main(data_dir):
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_file=os.path.join(data_dir, "tokenizer.json"), unk_token="[UNK]",
        pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64,
                        max_position_embeddings=32, pad_token_id=tokenizer.pad_token_id)
    args = TrainingArguments(
        output_dir=os.path.join(data_dir, "out"),
        per_device_train_batch_size=16,
        num_train_epochs=2,
        learning_rate=1e-3,
        dataloader_num_workers=2,
        seed=0,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )
    torch.manual_seed(0)
    model = BertForMaskedLM(config)
    collator = DataCollatorForLanguageModeling(tokenizer=tokenizer, mlm_probability=0.15)
    trainer = LossRecordingTrainer(
        model=model, args=args, data_collator=collator,
        train_dataset=LineByLineText(tokenizer, os.path.join(data_dir, "corpus.txt")))
    trainer.train()
    print("LOSSES", repr(trainer.step_losses), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
