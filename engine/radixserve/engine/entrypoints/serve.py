"""`radixserve serve`: launch the child processes, then the HTTP server in this process.

Start-up order: scheduler (loads the model, sizes the pools) and detokenizer → handshake →
tokenizer in this process → HTTP. Shutdown (Ctrl-C, SIGTERM, a child dying, or the tokenizer
manager's output loop dying): HTTP stops accepting, then children are terminated in order;
nothing is left behind. A failure-driven shutdown exits 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import AsyncIterator, Callable
from types import MappingProxyType
from typing import Any

import torch
import uvicorn
from fastapi import FastAPI

from radixserve.engine.configs.server_args import ServerArgs
from radixserve.engine.entrypoints.generation import collect
from radixserve.engine.entrypoints.http_server import create_app
from radixserve.engine.entrypoints.launch import (
    ChildProcesses,
    StartedChildren,
    start_subprocesses,
    wait_until_ready,
)
from radixserve.engine.entrypoints.reasoning import template_thinks_by_default
from radixserve.engine.entrypoints.request_builder import (
    OutputOptions,
    Prompt,
    ServerLimits,
    build_inputs,
)
from radixserve.engine.entrypoints.server_state import ServerState
from radixserve.engine.model_loader import ModelSource, load_model_files, resolve_model
from radixserve.engine.model_loader.generation_defaults import sampling_defaults
from radixserve.engine.model_loader.loader import load_tokenizer
from radixserve.engine.sampling import SamplingParams
from radixserve.engine.tokenizer.metrics import EngineMetrics
from radixserve.engine.tokenizer.request_log import RequestLogOptions
from radixserve.engine.tokenizer.tokenizer_manager import TokenizerManager
from radixserve.http_protocol import header_timeout_protocol
from radixserve.logging_setup import status_line

logger = logging.getLogger(__name__)

WATCH_INTERVAL_S = 1.0


def _model_info(
    args: ServerArgs, tokenizer: Any, info: dict[str, Any], files: Any
) -> dict[str, Any]:
    return {
        "model_path": args.model_path,
        "served_model_name": args.model_name,
        "architecture": files.config.architecture,
        "context_length": info["context_len"],
        "vocab_size": files.config.vocab_size,
        "page_size": args.page_size,
        "eos_token_ids": sorted(files.config.eos_token_ids),
        "chat_template": getattr(tokenizer, "chat_template", None),
        "is_generation": True,
    }


def _sampling_defaults(args: ServerArgs, source: ModelSource, vocab_size: int) -> dict[str, Any]:
    """--generation-config's defaults, checked as a request's would be (a bad file fails the
    start-up naming the flag, not every request)."""
    defaults = sampling_defaults(args.generation_config, source)
    try:
        SamplingParams.from_dict(defaults).verify(vocab_size)
    except ValueError as exc:
        raise ValueError(f"generation_config: {exc}") from None
    if defaults:
        status_line(f"radixserve: sampling defaults for unset request fields: {defaults}")
    return defaults


def build_state(
    args: ServerArgs,
    children: ChildProcesses,
    on_fatal: Callable[[BaseException], None] | None = None,
) -> ServerState:
    source = resolve_model(args.model_path, args.revision)
    files = load_model_files(source, args.resolved_dtype)
    tokenizer = load_tokenizer(source)
    info = children.scheduler_info
    defaults = _sampling_defaults(args, source, files.config.vocab_size)
    limits = ServerLimits(
        info["context_len"], info["max_req_input_len"], files.config.vocab_size, args.dp_size,
        args.grammar_backend, MappingProxyType(defaults), args.disaggregation_bootstrap_port,
    )  # fmt: skip
    metrics = EngineMetrics(args.model_name, args.disaggregation_mode != "null")
    request_log = RequestLogOptions(args.log_requests, args.log_requests_text)
    tm = TokenizerManager(
        tokenizer,
        children.ports,
        metrics,
        on_fatal,
        request_log,
        dp_size=args.dp_size,
        load_balance_method=args.load_balance_method,
    )
    model_info = _model_info(args, tokenizer, info, files) | {"sampling_defaults": defaults}
    thinks = args.reasoning_parser is not None and template_thinks_by_default(tokenizer)
    return ServerState(args, tokenizer, tm, children, metrics, model_info, limits, thinks)


def _shut_down_on_failure(children: ChildProcesses, what: str) -> None:
    """Say once why, and stop the server (uvicorn turns SIGTERM into a graceful shutdown);
    `serve` then exits 1."""
    children.crashed = True
    logger.error("%s; shutting the server down", what)
    status_line(f"radixserve: {what}; shutting down")
    os.kill(os.getpid(), signal.SIGTERM)


async def _watch_children(children: ChildProcesses) -> None:
    """If any child dies, say so once and stop the server instead of hanging requests."""
    while True:
        await asyncio.sleep(WATCH_INTERVAL_S)
        dead = children.dead()
        if dead:
            names = ", ".join(f"{p.name} (exit code {p.exitcode})" for p in dead)
            _shut_down_on_failure(children, f"child process died: {names}")
            return


def make_lifespan(state: ServerState) -> Any:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await state.tokenizer_manager.start()
        watcher = asyncio.create_task(_watch_children(state.children))
        if not state.args.skip_server_warmup:
            warm = build_inputs(
                [Prompt(None, [1, 2, 3])],
                [{"max_new_tokens": 1, "temperature": 0}],
                state.limits,
                OutputOptions(),
            )
            await collect(state.tokenizer_manager, warm)
        status_line(
            f"radixserve: serving {state.args.model_name} on "
            f"http://{state.args.host}:{state.args.port}"
        )
        try:
            yield
        finally:
            watcher.cancel()
            await state.tokenizer_manager.stop()

    return lifespan


def serve(args: ServerArgs, started: StartedChildren | None = None) -> int:
    """Serve until stopped; `started`: the children `start_subprocesses` already started
    (`radixserve serve` starts them before importing this module)."""
    if started is None:
        status_line(f"radixserve: loading {args.model_path} …")
        started = start_subprocesses(args)
    threads = (
        f" cpu_threads={args.cpu_threads(torch.get_num_threads())}" if args.device == "cpu" else ""
    )
    status_line(f"radixserve: settings: {args.effective_settings()}{threads}")
    children = wait_until_ready(started)
    try:
        state = build_state(
            args,
            children,
            lambda exc: _shut_down_on_failure(
                children, f"tokenizer manager output loop died ({type(exc).__name__}: {exc})"
            ),
        )
        app = create_app(state)
        app.router.lifespan_context = make_lifespan(state)
        # Bounded graceful shutdown: open streams are cut after a few seconds, not awaited.
        config = uvicorn.Config(
            app,
            host=args.host,
            port=args.port,
            log_level=args.log_level,
            log_config=None,  # uvicorn's records go to our root handler, in --log-format
            access_log=False,
            timeout_graceful_shutdown=5,
            # a connection that never sends its headers is closed (--header-timeout-s, else env)
            http=header_timeout_protocol(args.header_timeout_s),
        )
        # uvicorn shuts down gracefully on SIGINT/SIGTERM, then re-raises the signal.
        with contextlib.suppress(KeyboardInterrupt):
            uvicorn.Server(config).run()
    finally:
        children.shutdown()
    return 1 if children.crashed else 0
