"""The router benchmark's traffic: every order sends each tenant's requests once, in its shape."""

from __future__ import annotations

import pytest

from radixserve.bench.router_workload import ORDERS, TenantWorkload, build_requests


@pytest.mark.parametrize("order", ORDERS)
def test_every_order_sends_each_request_once_with_its_tenants_prefix(order: str) -> None:
    cfg = TenantWorkload(tenants=4, per_tenant=3, prefix_len=20, question_len=5, order=order)  # type: ignore[arg-type]
    reqs = build_requests(cfg)
    assert sorted(r.tenant for r in reqs) == sorted(list(range(4)) * 3)
    assert len({r.prompt for r in reqs}) == 12  # type: ignore[misc]
    for t in range(4):
        prompts = [str(r.prompt).split() for r in reqs if r.tenant == t]
        assert all(len(p) == 25 and p[:20] == prompts[0][:20] for p in prompts)
    assert build_requests(cfg) == reqs  # seeded


def test_orders_differ_as_documented() -> None:
    def tenants(order: str) -> list[int]:
        cfg = TenantWorkload(tenants=3, per_tenant=3, prefix_len=4, order=order, prompt_form="ids")  # type: ignore[arg-type]
        return [r.tenant for r in build_requests(cfg)]

    assert tenants("interleaved") == [0, 1, 2, 1, 2, 0, 2, 0, 1]  # rounds, rotated
    bursty = tenants("bursty")
    assert [bursty[i] for i in (0, 3, 6)] == sorted(set(bursty), key=bursty.index)
    assert all(bursty[i] == bursty[i - i % 3] for i in range(9))  # one tenant at a time
    assert sorted(tenants("random")) == [0, 0, 0, 1, 1, 1, 2, 2, 2]
