"""`radixserve bench one-batch`: a static batch through prefill and decode without the server
(SGLang's benchmark/one_batch), with a per-step breakdown.

B random prompts of `--input-len` tokens are prefilled in one EXTEND forward, then decoded
greedily for `--output-len` steps, each a DECODE forward of the whole batch straight through
the ModelRunner (no scheduler, no HTTP). With `--prefix-len P` the B prompts first share a
P-token prefix, prefilled once (its own row) and then mapped into every request's row as a
radix-cache hit would be, so the prefill row is B extends over a cached prefix and decode
reads the shared prefix's K/V (the serving benchmark's generated-shared-prefix workload).
With `--chunked-prefill-size C` the prompts are prefilled C tokens at a time, as the
scheduler's chunked prefill does: each chunk an EXTEND over the earlier chunks' K/V in the
pool; the prefill row is then the sum over the chunks. `--output-len 1` times prefill only.
Forward hooks time, per step: attention (the backend: KV write, gather, softmax), matmuls
(every projection), LM head; sampling is timed around the Sampler; "other" is the rest of
the forward (embedding, norms, rotary, activation, Python). CPU execution is synchronous,
so host clocks measure the work itself.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

from radixserve.bench.report import print_table, write_json
from radixserve.logging_setup import iter_progress

COLUMNS = ("stage", "ms", "attention_ms", "matmul_ms", "lm_head_ms", "sampling_ms", "other_ms")


def add_one_batch_parser(sub: Any) -> None:
    p = sub.add_parser("one-batch", help="static batch: prefill + decode, per-step breakdown")
    p.add_argument("--model-path", default="smollm2-135m")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--attention-backend", default="auto")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--prefix-len", type=int, default=0, help="shared prefix (radix hit) tokens")
    p.add_argument("--page-size", type=int, default=1)
    p.add_argument(
        "--chunked-prefill-size",
        type=int,
        default=-1,
        help="prefill in chunks of this many tokens per request, each over the earlier "
        "chunks' KV (-1: one forward)",
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--output-file", default="bench-results/one_batch.json")
    p.add_argument(
        "--disable-fused-ops",
        action="store_true",
        help="PyTorch norm/SiLU/rotary/MoE instead of the fused C++ / Triton ops (an A/B)",
    )
    p.add_argument(
        "--disable-weight-prepack",
        action="store_true",
        help="CPU bf16: plain weights and F.linear instead of weights packed at load (an A/B)",
    )
    p.add_argument(
        "--disable-amx-gemm",
        action="store_true",
        help="CPU bf16: oneDNN projections instead of the AMX kernel (an A/B)",
    )
    p.add_argument(
        "--disable-tiled-extend",
        action="store_true",
        help="CPU: extends through PyTorch SDPA, not the tiled C++ kernel (an A/B)",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="torch.profiler over prefill and decode: print the top ops by self CPU time",
    )
    p.set_defaults(handler=run_one_batch)


class StageTimer:
    """Accumulates seconds per category from forward pre/post hooks on the model's modules."""

    def __init__(self, model: Any) -> None:
        self.totals: dict[str, float] = defaultdict(float)
        self._starts: dict[int, float] = {}
        self._handles = []
        for name, module in model.named_modules():
            category = _category(name, type(module).__name__)
            if category is not None:
                self._handles.append(module.register_forward_pre_hook(self._pre))
                self._handles.append(module.register_forward_hook(self._post(category)))

    def _pre(self, module: Any, _inputs: Any) -> None:
        self._starts[id(module)] = time.perf_counter()

    def _post(self, category: str) -> Any:
        def hook(module: Any, _inputs: Any, _output: Any) -> None:
            self.totals[category] += time.perf_counter() - self._starts.pop(id(module))

        return hook

    def take(self) -> dict[str, float]:
        out, self.totals = dict(self.totals), defaultdict(float)
        return out

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


def _category(name: str, cls: str) -> str | None:
    if name.endswith("lm_head"):
        return "lm_head"
    if cls == "RadixAttention":
        return "attention"
    if cls.endswith("Linear"):
        return "matmul"
    return None


def _batch(runner: Any, mode: Any, reqs: dict[str, Any], complete: bool = True) -> Any:
    """A ForwardBatch for the static batch (rows, prefix/extend lengths, new tokens);
    `complete`: the extend ends the prompts (False for a chunk before the last)."""
    import torch

    from radixserve.engine.forward_batch import ForwardBatch

    def t(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64, device=runner.device)

    rows, prefix, ext = reqs["rows"], reqs["prefix"], reqs["extend"]
    seq = [p + e for p, e in zip(prefix, ext, strict=True)]
    table = runner.req_to_token_pool.req_to_token
    last = [int(table[r, p - 1]) if p else -1 for r, p in zip(rows, prefix, strict=True)]
    slots = runner.allocator.alloc_extend(prefix, seq, last)
    if slots is None:
        raise ValueError("--batch-size × (--input-len + --output-len) does not fit the KV pool")
    start = 0
    for r, p, e in zip(rows, prefix, ext, strict=True):
        runner.req_to_token_pool.write(r, p, slots[start : start + e])
        start += e
    positions = [p + j for p, e in zip(prefix, ext, strict=True) for j in range(e)]
    pool_idx = t(rows)
    return ForwardBatch(
        forward_mode=mode,
        batch_size=len(rows),
        input_ids=t(reqs["input_ids"]),
        positions=t(positions),
        req_pool_indices=pool_idx,
        seq_lens=t(seq),
        out_cache_loc=slots.to(runner.device),
        extend_prefix_lens_cpu=list(prefix),
        extend_seq_lens_cpu=list(ext),
        seq_lens_cpu=seq,
        req_to_token_pool=runner.req_to_token_pool,
        token_to_kv_pool=runner.token_to_kv_pool,
        attn_backend=runner.attn_backend,
        kv_rows=runner.req_to_token_pool.req_to_token[pool_idx, : max(seq)].to(torch.int64),
        extend_completes_cpu=[complete] * len(rows),
    )


def _step(runner: Any, timer: StageTimer, fb: Any, info: Any, label: str) -> dict[str, Any]:
    from radixserve.engine.sampling import Sampler

    start = time.perf_counter()
    logits = runner.forward(fb).next_token_logits
    forward_s = time.perf_counter() - start
    s0 = time.perf_counter()
    ids = Sampler().sample(logits, info).next_token_ids
    sampling_s = time.perf_counter() - s0
    parts = timer.take()
    known = sum(parts.values())
    row = {
        "stage": label,
        "ms": (forward_s + sampling_s) * 1000,
        "attention_ms": parts.get("attention", 0.0) * 1000,
        "matmul_ms": parts.get("matmul", 0.0) * 1000,
        "lm_head_ms": parts.get("lm_head", 0.0) * 1000,
        "sampling_ms": sampling_s * 1000,
        "other_ms": (forward_s - known) * 1000,
    }
    return {"row": row, "ids": ids.tolist()}


@contextlib.contextmanager
def _maybe_profile(enabled: bool, label: str) -> Iterator[None]:
    """torch.profiler around one stage; prints its top ops by self CPU time to stderr."""
    if not enabled:
        yield
        return
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        yield
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
    print(f"\n[profile] {label}\n{table}", file=sys.stderr, flush=True)


def _mean_rows(rows: list[dict[str, Any]], label: str) -> dict[str, Any]:
    out: dict[str, Any] = {"stage": label}
    for col in COLUMNS[1:]:
        out[col] = sum(r[col] for r in rows) / len(rows)
    return out


def _prefill(  # noqa: PLR0913 - the static batch's parts
    runner: Any,
    timer: StageTimer,
    info: Any,
    rows: list[int],
    prompts: list[list[int]],
    n_pre: int,
    chunk: int,
) -> dict[str, Any]:
    """The prompts after the `n_pre` cached tokens, in chunks of `chunk` tokens (≤ 0: one
    forward); the row sums the chunks' times, the ids are the last chunk's samples."""
    from radixserve.engine.forward_batch import ForwardMode

    n_in = len(prompts[0])
    step = n_in if chunk <= 0 else chunk
    parts = []
    for start in range(0, n_in, step):
        end = min(start + step, n_in)
        reqs = {"rows": rows, "prefix": [n_pre + start] * len(rows)}
        reqs["extend"] = [end - start] * len(rows)
        reqs["input_ids"] = [t for p in prompts for t in p[start:end]]
        fb = _batch(runner, ForwardMode.EXTEND, reqs, complete=end == n_in)
        parts.append(_step(runner, timer, fb, info, "prefill"))
    row = {col: sum(p["row"][col] for p in parts) for col in COLUMNS[1:]}
    label = "prefill" if len(parts) == 1 else f"prefill ({len(parts)} chunks)"
    return {"row": {"stage": label, **row}, "ids": parts[-1]["ids"]}


def _pool_tokens(batch: int, seq: int, page: int) -> int:
    """Enough slots for `batch` requests of `seq` tokens, whole pages each, plus slack."""
    return batch * -(-seq // page) * page + 2 * page


def _greedy_info(runner: Any, prompts: list[list[int]], n_out: int, vocab: int) -> Any:
    from radixserve.engine.sampling import SamplingBatchInfo, SamplingParams, SamplingRow

    params = SamplingParams(temperature=0.0, max_new_tokens=n_out)
    rows = [SamplingRow(params, p, [], frozenset(), None) for p in prompts]
    return SamplingBatchInfo.build(rows, vocab, runner.device)


def _shared_prefix(
    runner: Any, timer: StageTimer, rows: list[int], tokens: list[int], vocab: int
) -> dict[str, Any]:
    """Prefill `tokens` in the first row, then map its slots into every other row (as a
    radix-cache hit does: the same KV slots, no copy)."""
    from radixserve.engine.forward_batch import ForwardMode

    n = len(tokens)
    reqs = {"rows": rows[:1], "prefix": [0], "extend": [n], "input_ids": tokens}
    info = _greedy_info(runner, [tokens], 1, vocab)
    out = _step(runner, timer, _batch(runner, ForwardMode.EXTEND, reqs), info, "shared prefix")
    pool = runner.req_to_token_pool
    slots = pool.req_to_token[rows[0], :n].clone()
    for r in rows[1:]:
        pool.write(r, 0, slots)
    return out


def run_one_batch(args: argparse.Namespace) -> int:
    from radixserve.engine import EngineCore
    from radixserve.engine.forward_batch import ForwardMode

    bs, n_in, n_out, n_pre = args.batch_size, args.input_len, args.output_len, args.prefix_len
    if n_pre % args.page_size:
        raise SystemExit("--prefix-len must be a multiple of --page-size (whole pages are shared)")
    print(f"[bench] loading {args.model_path} …", file=sys.stderr, flush=True)
    engine = EngineCore(
        model_path=args.model_path,
        dtype=args.dtype,
        attention_backend=args.attention_backend,
        page_size=args.page_size,
        max_total_tokens=_pool_tokens(bs, n_in + n_out, args.page_size) + n_pre,
        disable_overlap_schedule=True,
        disable_fused_ops=args.disable_fused_ops,
        disable_weight_prepack=args.disable_weight_prepack,
        disable_amx_gemm=args.disable_amx_gemm,
        disable_tiled_extend=args.disable_tiled_extend,
    )
    runner, vocab = engine.runner, engine.model_config.vocab_size
    rng = random.Random(args.seed)
    prompts = [[rng.randrange(vocab) for _ in range(n_in)] for _ in range(bs)]
    rows = runner.req_to_token_pool.alloc(bs)
    info = _greedy_info(runner, prompts, n_out, vocab)
    timer = StageTimer(runner.model)
    shared = [rng.randrange(vocab) for _ in range(n_pre)]
    pre = _shared_prefix(runner, timer, rows, shared, vocab) if n_pre else None
    with _maybe_profile(args.profile, "prefill"):
        first = _prefill(runner, timer, info, rows, prompts, n_pre, args.chunked_prefill_size)
    decode_rows, ids = [], first["ids"]
    with _maybe_profile(args.profile, f"decode ({n_out - 1} steps)"):
        for i in iter_progress(range(n_out - 1), "one-batch decode", unit="step"):
            start = n_pre + n_in + i
            reqs = {"rows": rows, "prefix": [start] * bs, "extend": [1] * bs, "input_ids": ids}
            out = _step(runner, timer, _batch(runner, ForwardMode.DECODE, reqs), info, "decode")
            decode_rows.append(out["row"])
            ids = out["ids"]
    timer.remove()
    engine.shutdown()
    decode_mean = _mean_rows(decode_rows, "decode (mean/step)") if decode_rows else None
    table = [first["row"]] + ([decode_mean] if decode_mean else [])
    settings = engine.server_args.effective_settings()
    title = f"one batch: B={bs} prefix={n_pre} in={n_in} out={n_out} ({settings})"
    print_table(title, ([pre["row"]] if pre else []) + table, COLUMNS)
    summary = {
        "prefill_tok_per_s": bs * n_in / (first["row"]["ms"] / 1000),
        "decode_tok_per_s": bs / (decode_mean["ms"] / 1000) if decode_mean else None,
    }
    decode_text = f"{summary['decode_tok_per_s']:.1f} tok/s" if decode_mean else "not run"
    print(f"prefill {summary['prefill_tok_per_s']:.0f} tok/s, decode {decode_text}")
    write_json(
        args.output_file,
        {
            "benchmark": "one-batch",
            "settings": settings,
            "args": {k: v for k, v in vars(args).items() if k != "handler"},
            "shared_prefix": pre["row"] if pre else None,
            "prefill": table[0],
            "decode_mean": decode_mean,
            "decode_steps": decode_rows,
            **summary,
        },
    )
    return 0
