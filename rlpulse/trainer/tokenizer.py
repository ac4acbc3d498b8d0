"""A character-level tokenizer built locally with the ``tokenizers`` library (no downloads).

It is wrapped as a :class:`~transformers.PreTrainedTokenizerFast`, so ``save_pretrained``
writes a ``tokenizer.json`` that ``AutoTokenizer.from_pretrained`` loads back.

>>> tok = build_tokenizer()
>>> ids = tok("12+7=").input_ids
>>> tok.decode(ids)
'12+7='
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIALS = (PAD, BOS, EOS, UNK)
ALPHABET = "0123456789+-*=abcdefghijklmnopqrstuvwxyz "


def build_tokenizer(alphabet: str = ALPHABET) -> PreTrainedTokenizerFast:
    """One token per character of ``alphabet``, plus pad/bos/eos/unk (ids 0-3)."""
    vocab = {token: i for i, token in enumerate((*SPECIALS, *dict.fromkeys(alphabet)))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    # Split every character into its own piece; Fuse joins them back without spaces.
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        padding_side="left",
    )
