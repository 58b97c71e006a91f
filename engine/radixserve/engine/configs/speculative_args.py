"""The speculative-decoding flags' checks and defaults (SGLang's names; ServerArgs holds them).

Each refusal names its flag, at start-up, before any process starts. A draft model's
vocabulary is checked against the target's where both configs are read (`check_draft_model`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from radixserve.engine.configs.model_checks import check_flag

if TYPE_CHECKING:
    from radixserve.engine.configs.model_config import ModelConfig
    from radixserve.engine.configs.server_args import ServerArgs

SPECULATIVE_ALGORITHMS = ("NGRAM", "STANDALONE", "EAGLE")  # scheduler.speculation
DRAFT_MODEL_ALGORITHMS = ("STANDALONE", "EAGLE")  # those with --speculative-draft-model-path
NGRAM_DRAFT_TOKENS = 8  # --speculative-num-draft-tokens's default for NGRAM
STANDALONE_STEPS = 3  # --speculative-num-steps's default (SGLang's for STANDALONE)
MAX_DRAFT_TOKENS = 64


def draft_tokens(args: ServerArgs) -> int:
    """Tokens per request in one verify: the last sampled token plus its drafts."""
    n = args.speculative_num_draft_tokens
    if n is not None:
        return n
    if args.speculative_algorithm in DRAFT_MODEL_ALGORITHMS:
        return (args.speculative_num_steps or STANDALONE_STEPS) + 1
    return NGRAM_DRAFT_TOKENS


def check_speculative(args: ServerArgs) -> None:
    algorithm = args.speculative_algorithm
    if algorithm is None:
        return
    name = "speculative_algorithm"
    check_flag(not args.enable_dp_attention, name, "does not run with --enable-dp-attention")
    check_flag(
        args.disaggregation_mode != "prefill",
        name,
        "a prefill server samples one token per request: nothing to speculate",
    )
    check_flag(
        args.disable_overlap_schedule is not False,
        "disable_overlap_schedule",
        "speculative decoding runs without the overlap loop (a verify's next input is known "
        "only once its drafts were checked); leave the flag unset or true",
    )
    n = draft_tokens(args)
    check_flag(
        2 <= n <= MAX_DRAFT_TOKENS,
        "speculative_num_draft_tokens",
        f"must be in [2, {MAX_DRAFT_TOKENS}] (the last token plus 1 or more drafts), got {n}",
    )
    topk = args.speculative_eagle_topk
    check_flag(
        topk is None or topk == 1,
        "speculative_eagle_topk",
        f"only 1 (a chain of drafts) is served; trees are not yet, got {topk}",
    )
    if algorithm in DRAFT_MODEL_ALGORITHMS:
        _check_standalone(args, n)
    else:
        _check_ngram(args)
    off = args.speculative_disable_by_batch_size
    check_flag(
        off is None or off >= 1, "speculative_disable_by_batch_size", f"must be ≥ 1, got {off}"
    )


def _check_standalone(args: ServerArgs, n: int) -> None:
    check_flag(
        args.speculative_draft_model_path is not None,
        "speculative_draft_model_path",
        f"{args.speculative_algorithm} needs a draft model (STANDALONE: a smaller model with "
        "the target's vocabulary; EAGLE: a draft head)",
    )
    steps = args.speculative_num_steps or STANDALONE_STEPS
    check_flag(steps >= 1, "speculative_num_steps", f"must be ≥ 1, got {steps}")
    check_flag(
        n == steps + 1,
        "speculative_num_draft_tokens",
        f"with a chain (topk 1) must be --speculative-num-steps + 1 = {steps + 1}, got {n}",
    )


def _check_ngram(args: ServerArgs) -> None:
    low = args.speculative_ngram_min_match_window_size
    high = args.speculative_ngram_max_match_window_size
    check_flag(low >= 1, "speculative_ngram_min_match_window_size", f"must be ≥ 1, got {low}")
    check_flag(
        high >= low,
        "speculative_ngram_max_match_window_size",
        f"must be ≥ the min match window size {low}, got {high}",
    )
    cap = args.speculative_ngram_capacity
    check_flag(cap >= 1, "speculative_ngram_capacity", f"must be ≥ 1, got {cap}")


def check_draft_model(target: ModelConfig, draft: ModelConfig, eagle: bool = False) -> None:
    """A draft must propose the target's token ids: the same vocabulary size (its tokenizer is
    the target's), and fit the target's context; an EAGLE head reads the target's hidden
    states, so it has their width."""
    if eagle:
        check_flag(
            draft.hidden_size == target.hidden_size,
            "speculative_draft_model_path",
            f"the EAGLE head's hidden size {draft.hidden_size} is not the target's "
            f"{target.hidden_size}",
        )
    check_flag(
        draft.vocab_size == target.vocab_size,
        "speculative_draft_model_path",
        f"the draft's vocabulary has {draft.vocab_size} tokens, the target's {target.vocab_size}: "
        "a draft must share the target's tokenizer",
    )
    check_flag(
        draft.context_len >= target.context_len,
        "speculative_draft_model_path",
        f"the draft's context ({draft.context_len}) is shorter than the target's "
        f"({target.context_len})",
    )
