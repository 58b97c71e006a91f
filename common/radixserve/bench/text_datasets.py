"""Text workloads whose answers repeat their prompts, where speculative decoding should pay
(torch-free): real code and prose taken from radixserve's own torch-free packages, so nothing
is bundled and nothing was written to suit a drafter.

- code-rewrite: a function of ours (8–30 lines) to rewrite under a new name, everything else
  kept: the answer is mostly the prompt's code again.
- quote-summary: a module docstring of ours (400–1,500 characters) to summarise, quoting its
  key sentences word for word.

Prompts are text (each server tokenizes them itself); answers end where the model ends them
(no ignore_eos), up to `output_len` tokens.
"""

from __future__ import annotations

import ast
import random
from pathlib import Path

from radixserve.bench.datasets import BenchRequest

TEXT_DATASETS = ("code-rewrite", "quote-summary")


def _sources() -> list[Path]:
    """The .py files of the torch-free packages (the protocol, the router, this bench)."""
    import radixserve.bench
    import radixserve.protocol
    import radixserve.router

    modules = (radixserve.protocol, radixserve.router, radixserve.bench)
    roots = [Path(str(m.__file__)).parent for m in modules]
    return sorted(p for root in roots for p in root.rglob("*.py"))


def _functions() -> list[tuple[str, str]]:
    out = []
    for path in _sources():
        text = path.read_text()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                src = ast.get_source_segment(text, node)
                if src is not None and 8 <= src.count("\n") + 1 <= 30:
                    out.append((node.name, src))
    return out


def _docstrings() -> list[str]:
    out = []
    for path in _sources():
        doc = ast.get_docstring(ast.parse(path.read_text()))
        if doc is not None and 400 <= len(doc) <= 1500:
            out.append(doc)
    return out


def code_rewrite_prompt(name: str, src: str) -> str:
    return (
        f"Rewrite the following Python function, renaming it from `{name}` to `{name}_v2`. "
        f"Keep everything else exactly the same.\n\n```python\n{src}\n```\n\n"
        "The rewritten function:\n\n```python\n"
    )


def quote_summary_prompt(doc: str) -> str:
    return (
        f"{doc}\n\nSummarize the text above in a few sentences, quoting its most important "
        'sentences word for word.\n\nSummary: "'
    )


def text_requests(name: str, num: int, output_len: int, seed: int = 1) -> list[BenchRequest]:
    """`num` prompts of dataset `name` (drawn without replacement while they last)."""
    if name == "code-rewrite":
        texts = [code_rewrite_prompt(n, s) for n, s in _functions()]
    elif name == "quote-summary":
        texts = [quote_summary_prompt(d) for d in _docstrings()]
    else:
        raise ValueError(f"dataset_name: one of {', '.join(TEXT_DATASETS)}, got {name!r}")
    rng = random.Random(seed)
    rng.shuffle(texts)
    picked = [texts[i % len(texts)] for i in range(num)]
    return [BenchRequest([], output_len, text=t) for t in picked]
