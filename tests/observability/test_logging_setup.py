"""The shared formatters on hand-made records: JSON is one line per record whatever the
message holds, extras and the request id become fields, and request lines hold user text
only when asked."""

from __future__ import annotations

import io
import json
import logging
import sys

import pytest

from radixserve.engine.tokenizer.request_log import FinishedRequest, RequestLogOptions, log_finished
from radixserve.logging_setup import (
    NO_PROGRESS_ENV,
    REQUEST_ID,
    JsonFormatter,
    TextFormatter,
    configure_logging,
    iter_progress,
)


def _record(msg: str, **extra: object) -> logging.LogRecord:
    record = logging.makeLogRecord({"name": "t", "levelname": "INFO", "msg": msg})
    record.__dict__.update(extra)
    return record


def test_json_is_one_line_with_extras_and_tracebacks() -> None:
    try:
        raise ValueError("bad\nvalue")
    except ValueError:
        record = _record("two\nlines", tokens=3)
        record.exc_info = sys.exc_info()
    line = JsonFormatter("serve").format(record)
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["msg"] == "two\nlines" and entry["tokens"] == 3 and entry["process"] == "serve"
    assert "ValueError: bad" in entry["exc"]


def test_the_request_id_of_the_current_context_is_a_field() -> None:
    token = REQUEST_ID.set("abc")
    try:
        assert json.loads(JsonFormatter().format(_record("x")))["request_id"] == "abc"
        assert TextFormatter().format(_record("x")).endswith(" request_id=abc")
    finally:
        REQUEST_ID.reset(token)
    assert "request_id" not in json.loads(JsonFormatter().format(_record("x")))


def test_a_bad_format_names_the_flag() -> None:
    with pytest.raises(ValueError, match="log_format"):
        configure_logging("info", "yaml")


@pytest.mark.parametrize("with_text", [False, True])
def test_request_lines_hold_text_only_when_asked(
    with_text: bool, caplog: pytest.LogCaptureFixture
) -> None:
    done = FinishedRequest("r1", "h1", 5, 2, 0, 0.1, 0.2, "stop", "secret prompt", "answer")
    with caplog.at_level(logging.INFO, logger="radixserve.requests"):
        log_finished(done, RequestLogOptions(enabled=True, with_text=with_text))
        log_finished(done, RequestLogOptions(enabled=False, with_text=True))
    (record,) = caplog.records
    assert (record.request_id, record.rid, record.finish_reason) == ("h1", "r1", "stop")
    assert hasattr(record, "prompt_text") is with_text
    assert ("secret prompt" in JsonFormatter().format(record)) is with_text


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    ("tty", "disabled", "shown"), [(True, False, True), (False, False, False), (True, True, False)]
)
def test_progress_bars_only_on_a_terminal_and_not_with_no_progress(
    tty: bool, disabled: bool, shown: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    err = _Terminal() if tty else io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    if disabled:
        monkeypatch.setenv(NO_PROGRESS_ENV, "1")
    else:
        monkeypatch.delenv(NO_PROGRESS_ENV, raising=False)
    assert list(iter_progress(range(5), "loading weights", "tensor")) == list(range(5))
    assert ("loading weights" in err.getvalue()) is shown
