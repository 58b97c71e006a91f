"""SchedulerCore: the scheduler process's composition root — model files, ModelRunner and
Scheduler built once, and `make_req` turning a TokenizedGenerateReq into a Req.

Runs in the scheduler process (`scheduler_process.py`) and, in-process, inside the offline
`EngineCore` (entrypoints), which reuses it. It trusts its input: requests were validated at the
edge. Per-request sampling generators live on the runner's device. It loads the tokenizer only
for the grammar backend, when that first compiles (or at once for a reasoning parser's
"</think>" ids): the tokenizer's EOS id comes with each request, and stop strings are the
detokenizer's.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any

import torch

from radixserve.engine.configs.model_checks import check_tp_layout
from radixserve.engine.configs.server_args import ServerArgs
from radixserve.engine.configs.speculative_args import DRAFT_MODEL_ALGORITHMS
from radixserve.engine.constrained import (
    THINK_END,
    BaseGrammarBackend,
    JsonOptions,
    create_grammar_backend,
    grammar_key,
)
from radixserve.engine.distributed import ParallelGroups
from radixserve.engine.ipc.messages import TokenizedGenerateReq
from radixserve.engine.model_executor.model_runner import ModelRunner, kv_cell_bytes
from radixserve.engine.model_loader import load_model_files, resolve_model
from radixserve.engine.model_loader.loader import LoadedModelFiles, load_tokenizer
from radixserve.engine.model_loader.source import ModelSource
from radixserve.engine.models.base import CausalLM
from radixserve.engine.sampling import SamplingParams, make_generator
from radixserve.engine.scheduler.req import Req, StopCriteria
from radixserve.engine.scheduler.scheduler import Scheduler
from radixserve.engine.scheduler.tree_cache_setup import storage_id


def _draft_files(args: ServerArgs) -> LoadedModelFiles:
    """The draft model (STANDALONE) or head (EAGLE) in the target's dtype (checked at launch:
    its vocabulary)."""
    assert args.speculative_draft_model_path is not None  # ServerArgs checked it
    return load_model_files(resolve_model(args.speculative_draft_model_path), args.resolved_dtype)


def _draft_args(args: ServerArgs) -> ServerArgs:
    """The draft runner's view: its own model, no expert recording or balancing of its own."""
    return replace(
        args,
        model_path=args.speculative_draft_model_path or args.model_path,
        revision=None,
        expert_distribution_recorder_mode=None,
        enable_eplb=False,
        ep_num_redundant_experts=0,
        init_expert_location="trivial",
    )


def stop_criteria(params: SamplingParams, eos_ids: frozenset[int]) -> StopCriteria:
    """The EOS ids and the request's `stop_token_ids`."""
    return StopCriteria(eos_ids | frozenset(params.stop_token_ids or ()))


class SchedulerCore:
    """Model + Scheduler of one rank, in the calling process."""

    runner: ModelRunner
    scheduler: Scheduler

    def __init__(
        self,
        args: ServerArgs,
        reuse: SchedulerCore | None = None,
        groups: ParallelGroups | None = None,
    ) -> None:
        self.server_args = args
        # the tokenizer, loaded once when the grammar backend first needs it
        self.load_tokenizer: Callable[[], Any] | None = None
        torch.manual_seed(args.random_seed)
        self.source: ModelSource
        self.files: LoadedModelFiles
        model: CausalLM | None = None
        if reuse is not None:  # same weights, fresh pools and scheduler
            self.source, self.files = reuse.source, reuse.files
            model = reuse.runner.model
        else:
            self.source = resolve_model(args.model_path, args.revision)
            self.files = load_model_files(self.source, args.resolved_dtype)
        self.model_config = self.files.config
        if groups is not None and groups.attn_tp.size > 1:
            check_tp_layout(self.files.config, groups.attn_tp.size)
        self.draft_files: LoadedModelFiles | None = None
        self.draft_runner: ModelRunner | None = None
        if args.speculative_algorithm in DRAFT_MODEL_ALGORITHMS:
            same = reuse is not None and reuse.server_args.speculative_draft_model_path == (
                args.speculative_draft_model_path
            )
            self.draft_files = reuse.draft_files if same and reuse is not None else None
            self.draft_files = self.draft_files or _draft_files(args)
        draft_cell = 0 if self.draft_files is None else kv_cell_bytes(self.draft_files.config)
        self.runner = ModelRunner(args, self.files, model, groups, draft_cell_bytes=draft_cell)
        if self.draft_files is not None:
            reused = reuse.draft_runner if reuse is not None and same else None
            self.draft_runner = ModelRunner(
                _draft_args(args),
                self.draft_files,
                reused.model if reused is not None else None,
                groups,
                slots_of=self.runner,
            )
            share = getattr(self.draft_runner.model, "share_embed_and_head", None)
            if share is not None:  # an EAGLE head: the target's embedding and LM head
                share(self.runner.model)
        self.eos_token_ids = frozenset(self.files.config.eos_token_ids)
        self.scheduler = Scheduler(
            args, self.runner, self._grammar_backend(args, reuse), self.draft_runner
        )

    def _grammar_backend(
        self, args: ServerArgs, reuse: SchedulerCore | None
    ) -> BaseGrammarBackend | None:
        """The --grammar-backend, compiling against the model's tokenizer (loaded only for it,
        once, shared with a `with_args` core; the scheduler otherwise needs none)."""
        if args.grammar_backend == "none":
            return None
        if reuse is not None and reuse.load_tokenizer is not None:
            self.load_tokenizer = reuse.load_tokenizer
        else:
            self.load_tokenizer = functools.cache(functools.partial(load_tokenizer, self.source))
        options = JsonOptions(
            not args.constrained_json_disable_any_whitespace,
            args.constrained_json_max_whitespace_cnt,
        )
        vocab = self.model_config.vocab_size
        backend = create_grammar_backend(
            args.grammar_backend, self.load_tokenizer, vocab, sorted(self.eos_token_ids), options
        )
        if backend is not None and args.reasoning_parser is not None:
            tokenizer = self.load_tokenizer()
            backend.think_end_ids = list(tokenizer.encode(THINK_END, add_special_tokens=False))
        return backend

    def with_args(self, **overrides: Any) -> SchedulerCore:
        """A new core sharing this one's loaded weights, with other scheduling / memory args."""
        if "model_path" in overrides or "dtype" in overrides:
            raise ValueError("with_args: model_path and dtype need a new engine")
        args = ServerArgs.from_kwargs(**{**asdict(self.server_args), **overrides})
        return SchedulerCore(args, reuse=self)

    def make_req(self, msg: TokenizedGenerateReq) -> Req:
        """The scheduler's Req for a validated request (its generator on the runner's device)."""
        params = SamplingParams(**msg.sampling_params)
        # The model config's EOS ids (as in HF generate) and the tokenizer's, from the request.
        tokenizer_eos = frozenset(() if msg.eos_token_id is None else (msg.eos_token_id,))
        return Req(
            rid=msg.rid,
            origin_input_ids=list(msg.input_ids),
            sampling_params=params,
            stop=stop_criteria(params, self.eos_token_ids | tokenizer_eos),
            generator=make_generator(params.sampling_seed, self.runner.device),
            origin_input_text=msg.input_text,
            return_logprob=msg.return_logprob,
            top_logprobs_num=msg.top_logprobs_num,
            logprob_start_len=msg.logprob_start_len,
            arrival_time=time.monotonic(),
            stream=msg.stream,
            detokenize=msg.detokenize,
            bootstrap=msg.bootstrap,
            grammar_key=grammar_key(params),
            require_reasoning=msg.require_reasoning,
        )

    def context_info(self) -> dict[str, Any]:
        """The start-up handshake's limits (the tokenizer side validates against them)."""
        sched = self.scheduler
        return {
            "max_total_num_tokens": sched.max_total_tokens,
            "max_req_input_len": sched.max_req_input_len,
            "max_running_requests": sched.max_running_requests,
            "context_len": self.model_config.context_len,
            "hicache_storage_id": storage_id(sched.tree_cache),
        }

    def close(self) -> None:
        """Stop the forward worker and drop the KV pools (weights may be shared)."""
        self.scheduler.close()
