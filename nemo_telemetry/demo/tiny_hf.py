"""A tiny random Qwen2 and a word-level tokenizer, built on the spot: nothing fetched from a hub.

``nemo-telemetry demo --trainer trl`` trains it, and the integration tests do; it is a few
hundred kB and builds in well under a second. Needs ``torch``, ``transformers`` and ``tokenizers``
(the ``[trl]`` extra), imported when called.
"""

from __future__ import annotations

import os

WORDS = tuple("the quick brown fox jumps over a lazy dog and then runs home to eat some red apples while "
              "birds sing one two three four five six seven eight nine ten yes no good bad".split())
SPECIAL = ["<pad>", "<eos>", "<unk>"]


def build_tiny_model(directory: str, *, seed: int = 0, hidden_size: int = 16) -> str:
    """Save a 2-layer random Qwen2 (``hidden_size`` wide) and its tokenizer under ``directory``."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    os.makedirs(directory, exist_ok=True)
    vocab = {token: i for i, token in enumerate(SPECIAL + sorted(set(WORDS)))}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>",
                                        unk_token="<unk>")
    tokenizer.chat_template = ("{% for m in messages %}{{ m['content'] }} {% endfor %}"
                               "{% if add_generation_prompt %}{% endif %}")
    tokenizer.save_pretrained(directory)
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=len(vocab), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                         num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                         pad_token_id=vocab["<pad>"], eos_token_id=vocab["<eos>"], bos_token_id=None,
                         tie_word_embeddings=True)
    Qwen2ForCausalLM(config).save_pretrained(directory)
    return directory


def load_tokenizer(directory: str):
    """The word-level tokenizer saved by :func:`build_tiny_model` (``AutoTokenizer`` would map a
    ``qwen2`` config to Qwen2's BPE tokenizer class and lose the vocabulary)."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(directory, padding_side="left")


def prompts(count: int, *, seed: int = 0, words: int = 4) -> list[str]:
    """``count`` texts of ``words`` words drawn from the vocabulary."""
    import random

    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(words)) for _ in range(count)]
