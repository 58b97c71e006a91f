"""EngineCore: model, tokenizer and Scheduler in the calling process.

It is what each scheduler process runs, and it doubles as the in-process offline engine
(`generate(...)` blocks until every request finishes) used by tests and benchmarks that
compare scheduler configurations on one set of loaded weights (`with_args`).
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from typing import Any

import torch

from radixserve.engine.configs.server_args import ServerArgs
from radixserve.engine.entrypoints.request_builder import build_output, build_reqs, normalize_inputs
from radixserve.engine.managers.scheduler import Scheduler
from radixserve.engine.model_executor.model_runner import ModelRunner
from radixserve.engine.model_loader import load_model_files, resolve_model
from radixserve.engine.model_loader.loader import load_tokenizer

logger = logging.getLogger(__name__)


class EngineCore:
    def __init__(self, _reuse: EngineCore | None = None, **kwargs: Any) -> None:
        self.server_args = args = ServerArgs.from_kwargs(**kwargs)
        torch.manual_seed(args.random_seed)
        if _reuse is not None:  # same weights and tokenizer, fresh pools and scheduler
            self.source, files, self.tokenizer = _reuse.source, _reuse.files, _reuse.tokenizer
            model = _reuse.runner.model
        else:
            self.source = resolve_model(args.model_path, args.revision)
            files = load_model_files(self.source, args.resolved_dtype)
            self.tokenizer = load_tokenizer(self.source)
            model = None
        self.files = files
        self.model_config = files.config
        self.runner = ModelRunner(args, files, model)
        eos = set(files.config.eos_token_ids)
        if self.tokenizer.eos_token_id is not None:
            eos.add(int(self.tokenizer.eos_token_id))
        self.eos_token_ids = frozenset(eos)
        self.scheduler = Scheduler(args, self.runner, self._decode_tail)

    def with_args(self, **overrides: Any) -> EngineCore:
        """A new Engine sharing this one's loaded weights, with other scheduling / memory
        arguments (benchmarks and tests compare configurations without reloading)."""
        if "model_path" in overrides or "dtype" in overrides:
            raise ValueError("with_args: model_path and dtype need a new Engine")
        return EngineCore(_reuse=self, **{**asdict(self.server_args), **overrides})

    def _decode_tail(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def generate(  # noqa: PLR0913 - sglang.Engine.generate's public signature
        self,
        prompt: str | list[str] | None = None,
        sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None,
        input_ids: list[int] | list[list[int]] | None = None,
        return_logprob: bool = False,
        top_logprobs_num: int = 0,
    ) -> dict[str, Any] | list[dict[str, Any]]:
        """Generate for one prompt (→ dict) or a batch (→ list, n outputs per prompt)."""
        batch = normalize_inputs(self.tokenizer, prompt, input_ids, sampling_params)
        groups = build_reqs(
            batch,
            self.tokenizer,
            self.eos_token_ids,
            self.model_config.vocab_size,
            return_logprob,
            top_logprobs_num,
        )
        reqs = [r for g in groups for r in g]
        for req in reqs:
            self.scheduler.add_request(req)
        while not all(r.finished() for r in reqs):
            self.scheduler.step()
        # Drain bookkeeping of the last batch so the pool is back to idle.
        while self.scheduler.has_work():
            self.scheduler.step()
        outputs = [build_output(r, self.tokenizer) for r in reqs]
        if batch.is_single and len(outputs) == 1:
            return outputs[0]
        return outputs

    def shutdown(self) -> None:
        """Stop the forward worker and drop the KV pools (the weights may be shared with
        engines made by `with_args`, so they stay)."""
        self.scheduler.close()

    def __enter__(self) -> EngineCore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
