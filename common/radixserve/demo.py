"""`radixserve demo`: offline generation with the in-process Engine, printed as a table."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

DEMO_QUESTIONS = (
    "What is the capital of France?",
    "Give me three tips for writing clean Python code.",
    "Explain what a radix tree is in one sentence.",
    "Write a haiku about autumn.",
)


def add_demo_parser(sub: Any) -> None:
    p = sub.add_parser("demo", help="offline generation demo with the in-process engine")
    p.add_argument("--model-path", default="smollm2-135m")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--max-total-tokens", type=int, default=32768)
    p.add_argument("--prompt", action="append", help="a question (repeatable)")
    p.set_defaults(handler=run_demo)


def _progress(message: str) -> None:
    print(f"[radixserve] {message}", file=sys.stderr, flush=True)


def run_demo(args: argparse.Namespace) -> int:
    from radixserve.engine import Engine  # torch: imported only when the engine is used

    _progress(f"loading {args.model_path} …")
    start = time.perf_counter()
    engine = Engine(
        model_path=args.model_path, dtype=args.dtype, max_total_tokens=args.max_total_tokens
    )
    _progress(f"loaded in {time.perf_counter() - start:.1f}s; generating …")
    questions = args.prompt or DEMO_QUESTIONS
    prompts = [
        engine.tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True
        )
        for q in questions
    ]
    start = time.perf_counter()
    outs = engine.generate(
        prompt=prompts, sampling_params={"temperature": 0, "max_new_tokens": args.max_new_tokens}
    )
    elapsed = time.perf_counter() - start
    total = 0
    for q, out in zip(questions, outs, strict=True):
        meta = out["meta_info"]
        total += meta["completion_tokens"]
        print(
            f"\n>>> {q}\n{out['text'].strip()}\n"
            f"    [{meta['completion_tokens']} tokens, finish={meta['finish_reason']['type']}]"
        )
    print(
        f"\n{len(prompts)} prompts, {total} tokens in {elapsed:.1f}s "
        f"({total / elapsed:.1f} tok/s, batched)"
    )
    engine.shutdown()
    return 0
