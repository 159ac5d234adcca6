"""transformers' Trainer, masked language modelling with its data collator
(programs/hf_masked_lm.py): a tiny BERT, a tokenizer trained here from generated
text, 2 workers masking at random. Offline: nothing comes from the Hub."""

import random

from harness import check_no_fix, check_same_losses

PACKAGES = ("transformers", "tokenizers", "accelerate")
PROGRAM = "hf_masked_lm.py"
STEPS = 40  # 2 epochs of 20 batches

SUBJECTS = ["the %s %s" % (a, n) for a in ("red", "small", "old", "quick", "quiet")
            for n in ("fox", "robot", "river", "teacher", "engine", "garden")]
VERBS = ("sees", "follows", "builds", "paints", "moves", "finds", "answers")
ENDINGS = ("today", "at night", "near the hill", "with care", "again", "slowly")


def make_data(folder):
    """corpus.txt: 320 generated sentences; tokenizer.json: a word-level
    tokenizer trained on them (the tokenizers library, offline)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

    rng = random.Random(27)
    lines = ["%s %s %s %s" % (rng.choice(SUBJECTS), rng.choice(VERBS), rng.choice(SUBJECTS),
                              rng.choice(ENDINGS)) for _ in range(320)]
    (folder / "corpus.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train([str(folder / "corpus.txt")], trainers.WordLevelTrainer(
        special_tokens=specials))
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[(s, tokenizer.token_to_id(s))
                                                 for s in ("[CLS]", "[SEP]")])
    tokenizer.save(str(folder / "tokenizer.json"))


def test_linux_with_the_shim_same_losses_no_fix(linux, linux_shim):
    check_same_losses(linux_shim, linux)
    check_no_fix(linux_shim)


def test_as_on_macos_without_the_shim_it_runs(linux, macos):
    assert macos.rc == 0 and macos.losses == linux.losses, macos  # the tokenizer pickles


def test_as_on_macos_with_the_shim_the_linux_losses(linux, macos_shim):
    check_same_losses(macos_shim, linux)


# A program that works keeps working, and a rule changes something only where the
# program would fail. Spawned plainly, this one runs: transformers' tokenizer has a
# __getattr__, but one that answers pickle's question (AttributeError), so it is
# no forwarder to rebuild.
def test_as_on_macos_with_the_shim_no_repair_where_none_is_needed(macos, macos_shim):
    assert macos.rc == 0, macos
    assert [r["code"] for r in macos_shim.fixes()] == [], macos_shim
