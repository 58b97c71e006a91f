"""`radixserve bench serving` against the live server through both clients: the native
/generate stream and the OpenAI /v1/completions stream count the same tokens; with
`--json-schema` both constrain every answer, and jsonschema (not our code) validates each."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

import jsonschema

from radixserve.bench.serving import (
    add_serving_parser,
    build_requests,
    load_schema,
    run_benchmark,
    summarize,
)


def _args(base_url: str, backend: str, *extra: str) -> argparse.Namespace:
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
            *extra,
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


# No object: between a JSON object's tokens the grammar allows whitespace, which the 135M model
# on random-token prompts may write until max_tokens (this server keeps xgrammar's default)
SCHEMA = {"enum": ["yes", "no", "maybe"]}


def test_json_schema_constrains_and_validates_every_answer(server: Any, tmp_path: Path) -> None:
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(SCHEMA))
    for backend in ("radixserve", "openai"):
        # room for the object (the last --random-output-len wins): it ends where the schema does
        args = _args(
            server.base_url, backend, "--random-output-len", "64", "--json-schema", str(path)
        )
        schema = load_schema(args.json_schema)
        assert schema == SCHEMA
        results, duration = asyncio.run(run_benchmark(args, build_requests(args), schema))
        summary = summarize(results, duration, schema)
        assert (summary["successful"], summary["schema_valid"]) == (3, 3), (backend, results)
        for r in results:
            jsonschema.validate(json.loads(r.text), SCHEMA)
            assert r.output_tokens < 64  # ended by the grammar, not by max_tokens
