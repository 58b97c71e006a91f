"""One logging set-up for every radixserve process (engine, its children, router, operator).

`text` writes `key=value` lines for people; `json` writes one JSON object per line for log
pipelines (Loki, Elasticsearch, Cloud Logging): `ts`, `level`, `logger`, `process`, `msg`,
every `extra={...}` field of the record (a request line carries `request_id`), and `exc` when
there is a traceback. A record made while an HTTP request is served carries its
`request_id` (the X-Request-ID header, or a fresh id). Quiet by default: WARNING and above,
unless `--log-level` says otherwise.
Torch-free: the router and operator use it too.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator, MutableMapping
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, TypeVar

T = TypeVar("T")
LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("debug", "info", "warning", "error")
# The id of the HTTP request being served (X-Request-ID), set by the server's request
# middleware. A ContextVar is per asyncio task, so each request's records carry its own id.
REQUEST_ID: ContextVar[str | None] = ContextVar("radixserve_request_id", default=None)
# Attributes every LogRecord has: anything else on a record came in through `extra=`.
_RECORD_FIELDS = frozenset(vars(logging.makeLogRecord({}))) | {
    "message", "asctime", "taskName",
    "color_message",  # uvicorn's copy of the message with ANSI colours
}  # fmt: skip
REQUEST_ID_HEADER = b"x-request-id"
ASGIApp = Callable[
    [MutableMapping[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]],
    Awaitable[None],
]


def record_extras(record: logging.LogRecord) -> dict[str, Any]:
    """The fields a caller attached with `extra=` (token counts, …), and the id of the
    request being served when the record was made inside one."""
    extras = {k: v for k, v in vars(record).items() if k not in _RECORD_FIELDS}
    rid = REQUEST_ID.get()
    if rid is not None:
        extras.setdefault("request_id", rid)
    return extras


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (newlines inside values are escaped)."""

    def __init__(self, role: str | None = None) -> None:
        super().__init__()
        self.role = role

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
        }
        if self.role is not None:
            entry["process"] = self.role
        entry["msg"] = record.getMessage()
        entry.update(record_extras(record))
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """`ts level=… logger=… msg key=value …`: the extras follow the message."""

    def __init__(self, role: str | None = None) -> None:
        proc = f" process={role}" if role else ""
        super().__init__(f"%(asctime)s level=%(levelname)s{proc} logger=%(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extras = record_extras(record)
        if not extras:
            return line
        return line + "".join(f" {k}={_text_value(v)}" for k, v in extras.items())


def _text_value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return json.dumps(text) if (" " in text or not text) else text


def configure_logging(level: str = "warning", fmt: str = "text", role: str | None = None) -> None:
    """Replace the root logger's handlers with one stderr handler in `fmt`. Safe to call
    again (a child process, or a later, more specific call wins)."""
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log_format: must be one of {LOG_FORMATS}, got {fmt!r}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(role) if fmt == "json" else TextFormatter(role))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    logging.captureWarnings(True)  # warnings.warn(...) goes through the same handler


def status_line(text: str) -> None:
    """A line for the person at the terminal ("loading …", "serving on …"). Printed as is
    with text logs; with JSON logs it becomes an INFO record of `radixserve.status` (shown at
    every level), so stderr stays one JSON object per line."""
    root = logging.getLogger()
    if any(isinstance(h.formatter, JsonFormatter) for h in root.handlers):
        status = logging.getLogger("radixserve.status")
        status.setLevel(logging.INFO)
        for line in text.splitlines():
            status.info(line.strip())
    else:
        print(text, file=sys.stderr, flush=True)


class RequestIdMiddleware:
    """Pure ASGI: every HTTP request gets an id (its X-Request-ID header, else a fresh one,
    added to the request's headers so a proxy passes it on) in `REQUEST_ID`, so the records of
    its task (the access line included) carry it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(
        self,
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[Any]],
        send: Callable[[Any], Awaitable[None]],
    ) -> None:
        if scope["type"] == "http":
            headers = list(scope.get("headers") or [])
            rid = dict(headers).get(REQUEST_ID_HEADER, b"").decode()
            if not rid:
                rid = uuid.uuid4().hex
                scope["headers"] = [*headers, (REQUEST_ID_HEADER, rid.encode())]
            REQUEST_ID.set(rid)
        await self.app(scope, receive, send)


def add_logging_args(parser: argparse.ArgumentParser) -> None:
    """`--log-format text|json` and `--log-level` for the router, operator and `up`
    subcommands (the engine's come from its ServerArgs fields of the same names). The
    subcommand's `--log-level` is only set when given, so `radixserve --log-level info router`
    keeps working."""
    parser.add_argument(
        "--log-format",
        default="text",
        choices=LOG_FORMATS,
        help="text: key=value lines; json: one JSON object per line (stderr)",
    )
    parser.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default=argparse.SUPPRESS,
        help="same as radixserve --log-level (default: that one, else warning)",
    )


# ---- progress bars ------------------------------------------------------------------------------

NO_PROGRESS_ENV = "TQDM_DISABLE"  # tqdm's own switch; `radixserve --no-progress` sets it


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(total: int | None, desc: str, unit: str = "it") -> Any:
    """A tqdm bar on stderr (`update()`, `close()`). Off when stderr is not a terminal (logs,
    pipes, CI), with `--no-progress` / $TQDM_DISABLE=1, or where tqdm is not installed (the
    router's slim install)."""
    if not sys.stderr.isatty() or os.environ.get(NO_PROGRESS_ENV, "") not in ("", "0"):
        return _NoBar()
    try:
        from tqdm import tqdm  # type: ignore[import-untyped]  # no stubs installed; used untyped
    except ImportError:
        return _NoBar()
    # tqdm's default lock is a multiprocessing RLock: a semaphore that the resource tracker
    # reports as leaked when a child process is stopped. Our bars need only a thread lock.
    if not hasattr(tqdm, "_lock"):
        tqdm.set_lock(threading.RLock())
    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, leave=False)


def iter_progress(items: Iterable[T], desc: str, unit: str = "it") -> Iterator[T]:
    """`items`, ticking a progress bar (see `progress_bar`) per item."""
    bar = progress_bar(None, desc, unit)
    try:
        for item in items:
            yield item
            bar.update()
    finally:
        bar.close()
