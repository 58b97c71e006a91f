"""Synthetic workloads shared by the benchmarks (torch-free).

generated-shared-prefix (SGLang's GSP): `num_groups` system prompts of `system_len` random
tokens, each followed by `prompts_per_group` questions of `question_len` random tokens; all
requests shuffled. random: input/output lengths uniform in [len × range_ratio, len].
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class BenchRequest:
    input_ids: list[int]
    output_len: int
    group: int = 0
    text: str = ""  # a text prompt instead of ids (text_datasets): the server tokenizes it


@dataclass(frozen=True, slots=True)
class GSPConfig:
    num_groups: int = 8
    prompts_per_group: int = 8
    system_len: int = 512
    question_len: int = 32
    output_len: int = 16
    vocab_size: int = 49152
    seed: int = 1
    shuffle: bool = True


def gsp_from_args(args: Any, vocab_size: int, seed: int = 1) -> GSPConfig:
    """GSPConfig from the `--gsp-*` flags both benchmarks take."""
    return GSPConfig(
        args.gsp_num_groups,
        args.gsp_prompts_per_group,
        args.gsp_system_prompt_len,
        args.gsp_question_len,
        args.gsp_output_len,
        vocab_size,
        seed,
    )


def _tokens(rng: random.Random, n: int, vocab: int) -> list[int]:
    # Skip the low ids, where tokenizers keep special tokens (EOS among them).
    return [rng.randrange(100, vocab) for _ in range(n)]


def generated_shared_prefix(cfg: GSPConfig) -> list[BenchRequest]:
    rng = random.Random(cfg.seed)
    reqs = []
    for g in range(cfg.num_groups):
        system = _tokens(rng, cfg.system_len, cfg.vocab_size)
        for _ in range(cfg.prompts_per_group):
            question = _tokens(rng, cfg.question_len, cfg.vocab_size)
            reqs.append(BenchRequest(system + question, cfg.output_len, g))
    if cfg.shuffle:
        rng.shuffle(reqs)
    return reqs


def random_requests(  # noqa: PLR0913 - SGLang's random-dataset flags
    num: int, input_len: int, output_len: int, range_ratio: float, vocab_size: int, seed: int = 1
) -> list[BenchRequest]:
    rng = random.Random(seed)
    out = []
    for _ in range(num):
        n_in = rng.randint(max(int(input_len * range_ratio), 1), input_len)
        n_out = rng.randint(max(int(output_len * range_ratio), 1), output_len)
        out.append(BenchRequest(_tokens(rng, n_in, vocab_size), n_out))
    return out
