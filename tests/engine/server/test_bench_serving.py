"""`radixserve bench serving` against the live server through both clients: the native
/generate stream and the OpenAI /v1/completions stream count the same tokens."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from radixserve.bench.serving import add_serving_parser, build_requests, run_benchmark, summarize


def _args(base_url: str, backend: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_serving_parser(parser.add_subparsers())
    return parser.parse_args(
        [
            "serving",
            "--base-url",
            base_url,
            "--backend",
            backend,
            "--dataset-name",
            "random",
            "--num-prompts",
            "3",
            "--random-input-len",
            "12",
            "--random-output-len",
            "5",
            "--random-range-ratio",
            "1",
        ]
    )


def test_openai_and_native_backends_measure_the_same_tokens(server: Any) -> None:
    summaries = {}
    for backend in ("radixserve", "openai"):
        args = _args(server.base_url, backend)
        results, duration = asyncio.run(run_benchmark(args, build_requests(args)))
        summaries[backend] = summarize(results, duration)
    for s in summaries.values():
        assert (s["successful"], s["failed"]) == (3, 0), s["errors"]
        assert (s["input_tokens"], s["output_tokens"]) == (36, 15)
        assert s["mean_ttft_ms"] > 0
    # the second run sends the same prompts: the server reports them cached, and the OpenAI
    # client reads that from usage.prompt_tokens_details
    assert summaries["openai"]["cache_hit_rate"] > 0
