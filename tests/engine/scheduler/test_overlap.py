"""Overlap scheduling: the FutureMap ring lives on the runner's device, and the overlapped
loop gives the plain loop's outputs on CUDA (the `gpu` test skips without a CUDA device)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from radixserve.engine.sampling import SampleOutput
from radixserve.engine.scheduler.overlap import ForwardWorker, FutureMap

CPU = torch.device("cpu")


def test_future_map_buffer_is_on_the_given_device() -> None:
    # The meta device stands in for CUDA here: a ring on the CPU would not be on it.
    fm = FutureMap(8, torch.device("meta"))
    assert fm.buf.device.type == "meta"


def test_future_map_resolves_placeholders_from_stored_ids() -> None:
    fm = FutureMap(4, CPU)
    slots = fm.alloc(2)
    fm.store(slots, torch.tensor([11, 12]))
    ids = torch.tensor([5, -slots[0], 7, -slots[1]])
    assert fm.resolve(ids).tolist() == [5, 11, 7, 12]
    assert ids.tolist() == [5, -slots[0], 7, -slots[1]]  # the input is not modified


def test_future_map_slots_wrap_around_the_ring() -> None:
    fm = FutureMap(3, CPU)
    assert fm.alloc(4) == [1, 2, 3, 1]


def test_worker_stop_waits_for_the_forward_in_flight() -> None:
    """The last launched forward may still run when the engine shuts down (overlap launches
    one step ahead); stop() must return only after it, or the pools and the interpreter go
    away under it."""
    import threading
    from concurrent.futures import Future

    started, release = threading.Event(), threading.Event()

    def slow_forward(ids: torch.Tensor) -> SampleOutput:
        started.set()
        release.wait(5)
        return SampleOutput(ids + 1, torch.zeros(ids.shape), None)

    worker = ForwardWorker(FutureMap(4, CPU))
    fut: Future[SampleOutput] = Future()
    worker.submit(slow_forward, torch.tensor([1, 2]), [1, 2], fut)
    assert started.wait(5)
    threading.Timer(0.2, release.set).start()
    worker.stop()
    assert fut.done() and fut.result().next_token_ids.tolist() == [2, 3]
    assert not worker._thread.is_alive()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_overlap_loop_on_cuda_matches_the_plain_loop(tmp_path: Path) -> None:
    from radixserve.engine import EngineCore
    from tests.engine.models.tiny import random_prompts, save_tiny

    save_tiny("llama", tmp_path, tie_word_embeddings=True)
    shared = random_prompts((24,), seed=1)[0]
    prompts = [shared + p for p in random_prompts((5, 9, 13, 3), seed=2)]
    params = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}
    engine = EngineCore(model_path=str(tmp_path), device="cuda", max_total_tokens=4096)
    plain = engine.with_args(disable_overlap_schedule=True)
    try:
        assert engine.scheduler.overlap_thread is not None  # the overlapped loop
        assert engine.scheduler.future_map.buf.device.type == "cuda"
        got = [o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=params)]
        ref = [o["output_ids"] for o in plain.generate(input_ids=prompts, sampling_params=params)]
        assert got == ref
        engine.scheduler.check_memory_invariant()
    finally:
        plain.shutdown()
        engine.shutdown()
