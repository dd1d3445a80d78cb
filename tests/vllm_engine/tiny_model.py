"""A tiny random Llama and a word-level tokenizer, written to a directory: a model vLLM loads with no hub.

The vLLM tests and ``bench/gpu_vllm_check.py`` need real engine work (prefill, decode,
scheduling, tracing), not meaningful text, so random weights are enough, and machines without
network access cannot download a model. Uses only ``torch``, ``transformers`` and ``tokenizers``,
which every vLLM install brings. ``head_dim`` is 64: vLLM's CPU attention kernels refuse small ones.
"""

from __future__ import annotations

from pathlib import Path

SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")
WORDS = ("the", "number", "is", "and", "a", "of", "step", "reward", "prompt", "answer")


def word_vocabulary(numbers: int = 200) -> dict[str, int]:
    """Special tokens, a few words and the numbers ``0..numbers-1``, each one token."""
    tokens = [*SPECIAL_TOKENS, *WORDS, *(str(i) for i in range(numbers))]
    return {token: i for i, token in enumerate(tokens)}


def build_tiny_llama(directory: Path, *, dtype: str = "float32", layers: int = 2, hidden: int = 128,
                     heads: int = 2) -> Path:
    """Write a ``layers``-layer Llama with random weights and a word-level tokenizer to ``directory``."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    directory = Path(directory)
    tokenizer = Tokenizer(models.WordLevel(vocab=word_vocabulary(), unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece(prefix="##")  # joins tokens with spaces
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>")
    fast.save_pretrained(directory)
    config = LlamaConfig(vocab_size=len(fast), hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
                         max_position_embeddings=256, bos_token_id=fast.bos_token_id,
                         eos_token_id=fast.eos_token_id, pad_token_id=fast.unk_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(config).to(getattr(torch, dtype)).save_pretrained(directory)
    return directory
