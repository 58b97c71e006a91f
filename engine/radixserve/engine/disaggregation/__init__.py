"""Prefill/decode disaggregation: the KV-transfer layer under the scheduler.

`wire` (control messages and the topology both sides compare), `transfer` (the one
KV-transfer interface: Mooncake's TransferEngine, or an in-process fake for unit tests),
`bootstrap` (the prefill's bootstrap HTTP server and the decode's client of it) and
`kv_manager` (one rank's control sockets, registered KV buffers and transfer thread). The
request queues that use them are the scheduler's (`scheduler/disagg_prefill.py`,
`scheduler/disagg_decode.py`); nothing here knows a request.
"""
