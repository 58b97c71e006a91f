"""`bench serving` workloads: the warm-pass variant keeps the system prompts, redraws questions."""

from __future__ import annotations

import argparse

from radixserve.bench.serving import add_serving_parser, build_requests


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_serving_parser(parser.add_subparsers())
    return parser.parse_args(["serving", *argv])


GSP = (
    "--gsp-num-groups",
    "2",
    "--gsp-prompts-per-group",
    "4",
    "--gsp-system-prompt-len",
    "20",
    "--gsp-question-len",
    "5",
)


def test_question_seed_keeps_prefixes_and_changes_suffixes() -> None:
    first = build_requests(_args(*GSP))
    warm = build_requests(_args(*GSP, "--gsp-question-seed", "7"))
    assert [len(r.input_ids) for r in warm] == [25] * 8
    assert [r.input_ids[:20] for r in warm] == [r.input_ids[:20] for r in first]
    assert all(a.input_ids[20:] != b.input_ids[20:] for a, b in zip(first, warm, strict=True))
    assert [(r.output_len, r.group) for r in warm] == [(r.output_len, r.group) for r in first]


def test_openai_backend_is_a_choice() -> None:
    args = _args("--backend", "openai", "--model", "smollm2")
    assert (args.backend, args.model) == ("openai", "smollm2")
