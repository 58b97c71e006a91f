"""The Mooncake backend on its own: two TransferEngines in one process (TCP), a write of more
entries than one Mooncake batch takes (a long prompt's re-sliced rows, or scattered pages)."""

from __future__ import annotations

import pytest
import torch

from radixserve.engine.disaggregation.transfer import MooncakeBackend

pytest.importorskip("mooncake.engine")


def test_a_write_of_many_entries_arrives_whole_and_the_engine_keeps_working() -> None:
    a, b = MooncakeBackend("127.0.0.1"), MooncakeBackend("127.0.0.1")
    try:
        n, size = 5000, 64  # over 2,048 entries in one batch made it fail (and every later one)
        src = torch.randn(n * size // 4)
        dst = torch.zeros_like(src)
        a.register([(src.data_ptr(), src.numel() * 4)])
        b.register([(dst.data_ptr(), dst.numel() * 4)])
        # every other 64-byte piece, so no two entries merge into one
        offsets = [i * size for i in range(0, n, 2)]
        s = [src.data_ptr() + o for o in offsets]
        d = [dst.data_ptr() + o for o in offsets]
        assert a.write(b.session_id, s, d, [size] * len(s)) == 0
        got, want = dst.view(-1, size // 4), src.view(-1, size // 4)
        assert torch.equal(got[::2], want[::2]) and not got[1::2].any()
        assert a.write(b.session_id, s[:1], d[:1], [size]) == 0  # still usable
    finally:
        a.close()
        b.close()
