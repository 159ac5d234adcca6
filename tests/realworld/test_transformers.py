"""transformers' Trainer, masked language modelling with its data collator
(programs/hf_masked_lm.py): a tiny BERT, a tokenizer trained here from generated
text, 2 workers masking at random. Offline: nothing comes from the Hub."""

import random

import pytest

from harness import check_linux_shim, check_macos_shim, run

PACKAGES = ("transformers", "tokenizers", "accelerate")
PROGRAM = "hf_masked_lm.py"

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


@pytest.fixture(scope="module")
def linux(tmp_path_factory):
    """Data, and the plain Linux run (fork, no shim): the reference losses."""
    folder = tmp_path_factory.mktemp("transformers")
    make_data(folder)
    plain = run(folder, PROGRAM, "linux", [folder])
    assert plain.rc == 0 and plain.losses and len(plain.losses) == 40, plain
    return folder, plain


def test_linux_with_the_shim_same_losses_no_fix(linux):
    folder, plain = linux
    check_linux_shim(run(folder, PROGRAM, "linux-shim", [folder]), plain)


def test_as_on_macos_with_the_shim_the_linux_losses(linux):
    folder, plain = linux
    check_macos_shim(run(folder, PROGRAM, "macos-shim", [folder]), plain)


# The spec: a program that works keeps working, and a rule changes something only
# where the program would fail. Spawned plainly, this one runs (transformers'
# tokenizer pickles and unpickles), but the shim takes the tokenizer's __getattr__
# for a forwarder that would not unpickle and records DL201 "rebuilt from its
# attributes" (with a DL209 warm start). Kept as the spec says, for the package to meet.
@pytest.mark.xfail(strict=True, reason="DL201 repairs transformers' tokenizer (a "
                   "__getattr__ that raises AttributeError) though it pickles as it is")
def test_as_on_macos_without_the_shim_it_runs_so_the_shim_repairs_nothing(linux):
    folder, plain = linux
    mac = run(folder, PROGRAM, "macos", [folder])
    assert mac.rc == 0 and mac.losses == plain.losses, mac  # the tokenizer pickles
    shim = run(folder, PROGRAM, "macos-shim", [folder])
    assert shim.rc == 0 and shim.losses == plain.losses, shim
    assert [r["code"] for r in shim.fixes()] == [], shim
