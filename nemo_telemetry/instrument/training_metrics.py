"""The training scalars a trainer logs under ``train``, teed to ``rl.*`` series.

The keys are NeMo-RL's (``grpo.py`` / ``sft.py`` / ``dpo.py`` write them into the dict they pass
to ``Logger.log_metrics(..., prefix="train")``); write the dict with these constants so the
logged key and the exported series cannot drift apart::

    metrics = {REWARD_KEY: rewards.mean(), LOSS_KEY: loss, GRAD_NORM_KEY: grad_norm, LR_KEY: lr}
    logger.log_metrics(metrics, step, prefix=TRAIN_PREFIX)
    tee_metrics(TRAIN_PREFIX, metrics)

Each row's logger key is ``train/<key>``, so a ``loss`` logged under ``validation`` does not
land in ``rl.policy.loss``. Values are the step's already-reduced scalars (the trainer means or
sums them before logging); the series are gauges, one value per step.
"""

from __future__ import annotations

from nemo_telemetry.instrument.metrics import TeedMetric, register_teed_metrics

__all__ = [
    "TRAIN_PREFIX",
    "TRAINING_METRICS",
    "REWARD_KEY",
    "LOSS_KEY",
    "GRAD_NORM_KEY",
    "LR_KEY",
    "WEIGHT_DECAY_KEY",
    "MEAN_PROMPT_LENGTH_KEY",
    "TOTAL_NUM_TOKENS_KEY",
    "MEAN_GEN_TOKENS_PER_SAMPLE_KEY",
    "TOKEN_MULT_PROB_ERROR_KEY",
    "GEN_KL_ERROR_KEY",
    "APPROX_ENTROPY_KEY",
    "GLOBAL_VALID_SEQS_KEY",
    "GLOBAL_VALID_TOKS_KEY",
    "ACCURACY_KEY",
]

TRAIN_PREFIX = "train"

REWARD_KEY = "reward"
LOSS_KEY = "loss"
GRAD_NORM_KEY = "grad_norm"
LR_KEY = "lr"
WEIGHT_DECAY_KEY = "wd"
MEAN_PROMPT_LENGTH_KEY = "mean_prompt_length"
TOTAL_NUM_TOKENS_KEY = "total_num_tokens"
MEAN_GEN_TOKENS_PER_SAMPLE_KEY = "mean_gen_tokens_per_sample"
TOKEN_MULT_PROB_ERROR_KEY = "token_mult_prob_error"
GEN_KL_ERROR_KEY = "gen_kl_error"
APPROX_ENTROPY_KEY = "approx_entropy"
GLOBAL_VALID_SEQS_KEY = "global_valid_seqs"
GLOBAL_VALID_TOKS_KEY = "global_valid_toks"
ACCURACY_KEY = "accuracy"


def _train(key: str, name: str, unit: str, description: str) -> TeedMetric:
    return TeedMetric(f"{TRAIN_PREFIX}/{key}", name, "gauge", unit, description)


TRAINING_METRICS = (
    _train(REWARD_KEY, "rl.reward.mean", "1", "Mean reward over the step's samples"),
    _train(LOSS_KEY, "rl.policy.loss", "1", "Policy loss of the step"),
    _train(GRAD_NORM_KEY, "rl.grad_norm", "1", "Gradient norm before clipping"),
    _train(LR_KEY, "rl.learning_rate", "1", "Learning rate of the step"),
    _train(WEIGHT_DECAY_KEY, "rl.weight_decay", "1", "Weight decay of the step"),
    _train(MEAN_PROMPT_LENGTH_KEY, "rl.prompt.length.mean", "{token}", "Mean prompt length in tokens"),
    _train(TOTAL_NUM_TOKENS_KEY, "rl.train.tokens", "{token}", "Tokens the step trained on"),
    _train(MEAN_GEN_TOKENS_PER_SAMPLE_KEY, "rl.generation.tokens_per_sample.mean", "{token}",
           "Mean generated tokens per sample"),
    _train(TOKEN_MULT_PROB_ERROR_KEY, "rl.policy.token_mult_prob_error", "1",
           "Mismatch between generation and training token probabilities"),
    _train(GEN_KL_ERROR_KEY, "rl.policy.gen_kl_error", "1", "KL between the generation and training policies"),
    _train(APPROX_ENTROPY_KEY, "rl.policy.entropy", "1", "Approximate entropy of the policy"),
    _train(GLOBAL_VALID_SEQS_KEY, "rl.train.valid_sequences", "{sequence}", "Valid sequences in the global batch"),
    _train(GLOBAL_VALID_TOKS_KEY, "rl.train.valid_tokens", "{token}", "Valid tokens in the global batch"),
    _train(ACCURACY_KEY, "rl.train.accuracy", "1", "Training accuracy (DPO, RM: preference accuracy)"),
)
"""The ``train`` dict keys teed to ``rl.*`` series (docs/instrument.md lists them)."""

register_teed_metrics(TRAINING_METRICS)
