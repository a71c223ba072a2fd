"""Hub-layout model folders made offline, for the tests and the benchmarks (the hf extra).

No pytest here: the benchmarks import it too.
"""

from pathlib import Path
from typing import Any


def trained_tokenizer(folder: Path, corpus: Path, vocab: int) -> Any:
    """A byte-level BPE tokenizer of up to `vocab` tokens trained on `corpus`, with an
    `<eos>` token, saved into `folder` as a hub folder holds one; the tokenizer."""
    import tokenizers  # noqa: PLC0415  (the hf extra, imported where it is used)
    import transformers  # noqa: PLC0415

    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=["<eos>"],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus.read_text(encoding="utf-8").splitlines(), trainer)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")  # noqa: S106
    fast.save_pretrained(folder)
    return fast
