"""Benchmark results: a fixed-width table on stdout and a JSON file."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def print_table(title: str, rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> None:
    def fmt(v: Any) -> str:
        return f"{v:.2f}" if isinstance(v, float) else str(v)

    widths = [max(len(c), *(len(fmt(r.get(c, ""))) for r in rows)) for c in columns]
    line = "  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))
    print(f"\n{title}\n{line}\n{'-' * len(line)}")
    for r in rows:
        print("  ".join(fmt(r.get(c, "")).ljust(w) for c, w in zip(columns, widths, strict=True)))


def write_json(path: str | None, payload: dict[str, Any]) -> None:
    if not path:
        return
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(payload, indent=2))
    print(f"\nresults written to {p}")
