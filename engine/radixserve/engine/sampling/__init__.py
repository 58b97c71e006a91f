"""Sampling: request parameters, their per-batch tensor layout, and next-token selection.

Re-exports the public names of `sampling_params`, `sampling_batch_info` and `sampler`.
"""

from __future__ import annotations

from .sampler import (
    PromptLogprobs,
    SampleOutput,
    Sampler,
    draw_from_cdf,
    filtered_probs,
    make_generator,
    top_logprobs_of,
)
from .sampling_batch_info import SamplingBatchInfo, SamplingRow
from .sampling_params import SamplingParams

__all__ = [
    "PromptLogprobs",
    "SampleOutput",
    "Sampler",
    "SamplingBatchInfo",
    "SamplingParams",
    "SamplingRow",
    "draw_from_cdf",
    "filtered_probs",
    "make_generator",
    "top_logprobs_of",
]
