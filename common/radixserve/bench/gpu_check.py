"""The prepared GPU check (`scripts/gpu_check.sh` runs it after the gpu-marked tests).

Three measurements, each a section that prints its rows and adds them to one JSON file:

- `bandwidth`: device-to-device copy bandwidth (read + write bytes over time), the roofline's
  denominator.
- `parity`: greedy tokens of a model (SmolLM2 by default) on the GPU through the engine for
  every attention backend installed, eager and with CUDA graphs, each against the `torch`
  backend eager on the same GPU and weights.
- `decode`: decode throughput of a random-weight Llama of the given shape (default the 8B
  one: 32 layers, hidden 4096, 32 / 8 heads, intermediate 14336, bf16) straight through the
  ModelRunner (triton backend) at batch sizes 1, 8, 64 after a `--context`-token prefill,
  eager and replayed from graphs, against the HBM roofline (weight + KV bytes per step over
  the measured copy bandwidth) and transformers' `generate` on the same GPU and weights.

`--device cpu --layers 2 --hidden 64 ...` runs the same code on tiny shapes (a smoke test of
the script itself; no graphs, no roofline meaning). Nothing here is imported by the engine.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from radixserve.bench.report import print_table

PARITY_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "List three primary colors.",
    "Once upon a time, in a small village at the edge of a dark forest,",
    "Q: What is 12 times 7?\nA:",
    "Translate to French: I like apples.",
    "The three laws of thermodynamics are",
    "Write a haiku about the sea:",
]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_bandwidth(device: torch.device, gib: float = 2.0, iters: int = 20) -> float:
    """GB/s of a device-to-device copy, counting the bytes read and the bytes written."""
    n = int(gib * 2**30)
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    sync(device)
    start = time.perf_counter()
    for _ in range(iters):
        dst.copy_(src)
    sync(device)
    return 2 * n * iters / (time.perf_counter() - start) / 1e9


# ---- greedy parity through the engine ----


def backends_to_compare(device: torch.device) -> list[tuple[str, bool, bool]]:
    """(backend, graphs, fused ops) triples: torch eager is the oracle (first). The triton
    backend runs the Triton norm / SiLU / rotary ops unless fused ops are off (one row
    without them tells attention from those kernels)."""
    if device.type != "cuda":
        return [("torch", False, False), ("grouped", False, True)]
    pairs = [("torch", False, False), ("triton", False, False), ("triton", False, True),
             ("triton", True, True)]  # fmt: skip
    if importlib.util.find_spec("flashinfer") is not None:
        pairs.append(("flashinfer", False, True))
    return pairs


def greedy(
    model_path: str, device: str, backend: str, graphs: bool, new: int, fused: bool = True
) -> list[list[int]]:
    from radixserve.engine import EngineCore

    engine = EngineCore(
        model_path=model_path, device=device, dtype="bfloat16", attention_backend=backend,
        disable_cuda_graph=not graphs, cuda_graph_max_bs=16, max_total_tokens=8192,
        disable_fused_ops=not fused,
    )  # fmt: skip
    try:
        if graphs and engine.runner.graph_runner is None:
            raise RuntimeError(f"{backend}: CUDA graphs were not captured")
        prompts = [list(engine.tokenizer.encode(p)) for p in PARITY_PROMPTS]
        params = {"temperature": 0, "max_new_tokens": new, "ignore_eos": True}
        outs = engine.generate(input_ids=prompts, sampling_params=params)
        return [list(o["output_ids"]) for o in outs]
    finally:
        engine.shutdown()


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def parity_rows(model_path: str, device: torch.device, new: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    reference: list[list[int]] | None = None
    for backend, graphs, fused in backends_to_compare(device):
        start = time.perf_counter()
        try:
            outs = greedy(model_path, str(device), backend, graphs, new, fused)
        except Exception as exc:  # a failing backend is a row of the table
            rows.append({"backend": backend, "graphs": graphs, "fused_ops": fused,
                         "identical": f"error: {exc}"})  # fmt: skip
            continue
        if reference is None:
            reference = outs
        same = sum(o == r for o, r in zip(outs, reference, strict=True))
        agree = sum(common_prefix(o, r) for o, r in zip(outs, reference, strict=True))
        rows.append({
            "backend": backend, "graphs": graphs, "fused_ops": fused,
            "identical": f"{same}/{len(outs)}",
            "prefix_agree": f"{agree}/{sum(len(r) for r in reference)}",
            "seconds": time.perf_counter() - start,
        })  # fmt: skip
    return rows


# ---- decode throughput of a random-weight Llama ----


def llama_config(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": args.hidden,
        "intermediate_size": args.intermediate,
        "num_hidden_layers": args.layers,
        "num_attention_heads": args.heads,
        "num_key_value_heads": args.kv_heads,
        "vocab_size": args.vocab,
        "max_position_embeddings": args.context + args.steps * 2 + 64,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
    }


def hf_model(cfg: dict[str, Any], device: torch.device, dtype: torch.dtype) -> Any:
    """transformers' Llama with random weights, built on the device in `dtype`."""
    import transformers as tf

    hf_cfg = tf.LlamaConfig(**{k: v for k, v in cfg.items() if k != "architectures"})
    torch.manual_seed(0)
    with torch.device(device):
        model = tf.LlamaForCausalLM._from_config(hf_cfg, dtype=dtype)  # transformers >= 4.56
    return model.eval()


def our_runner(cfg: dict[str, Any], hf: Any, args: argparse.Namespace) -> Any:
    """A ModelRunner (triton backend, graphs up to the largest batch) holding hf's weights."""
    from radixserve.engine.configs.model_config import ModelConfig
    from radixserve.engine.configs.server_args import ServerArgs
    from radixserve.engine.model_executor.model_runner import ModelRunner
    from radixserve.engine.model_loader.loader import LoadedModelFiles
    from radixserve.engine.model_loader.source import ModelSource
    from radixserve.engine.models import get_model_class

    config = ModelConfig.from_hf_dict(cfg, args.dtype)
    device = torch.device(args.device)
    with torch.device(device):
        model = get_model_class(config.architecture)(config)
    model.load_weights(hf.state_dict().items())
    model.to(dtype=config.dtype).eval()
    for name, buf in model.named_buffers():  # rotary tables stay float32, as the loader does
        if "cos_cached" in name or "sin_cached" in name:
            buf.data = buf.data.float()
    max_bs = max(args.batch_sizes)
    server = ServerArgs(
        device=args.device, dtype=args.dtype, attention_backend=args.backend,
        max_total_tokens=max_bs * (args.context + 2 * args.steps + 8) + 64,
        max_running_requests=max_bs + 1, cuda_graph_max_bs=max_bs,
        disable_cuda_graph=device.type != "cuda", disable_fused_ops=args.disable_fused_ops,
    )  # fmt: skip
    files = LoadedModelFiles(
        ModelSource("hf", Path("random-llama"), "random-llama"), config, cfg,
        lambda: iter(()), lambda: iter(()),
    )  # fmt: skip
    return ModelRunner(server, files, model=model)


def kv_bytes_per_token(cfg: dict[str, Any], dtype: torch.dtype) -> int:
    head_dim = cfg["hidden_size"] // cfg["num_attention_heads"]
    elem = torch.empty(0, dtype=dtype).element_size()
    return int(cfg["num_hidden_layers"] * 2 * cfg["num_key_value_heads"] * head_dim * elem)


def weight_bytes_per_step(model: Any) -> int:
    """Every parameter is read once per decode step, except the embedding (B rows)."""
    return sum(
        p.numel() * p.element_size()
        for name, p in model.named_parameters()
        if "embed_tokens" not in name
    )


def decode_steps(runner: Any, rows: list[int], ids: list[int], start: int, steps: int) -> Any:
    """`steps` greedy DECODE forwards of the batch; returns (seconds in forward+argmax, ids)."""
    from radixserve.bench.one_batch import _batch
    from radixserve.engine.forward_batch import ForwardMode

    bs, total = len(rows), 0.0
    for i in range(steps):
        reqs = {"rows": rows, "prefix": [start + i] * bs, "extend": [1] * bs, "input_ids": ids}
        fb = _batch(runner, ForwardMode.DECODE, reqs)
        sync(runner.device)
        t0 = time.perf_counter()
        logits = runner.forward(fb).next_token_logits
        next_ids = logits.argmax(-1)
        sync(runner.device)
        total += time.perf_counter() - t0
        ids = next_ids.tolist()
    return total, ids


def ours_at(runner: Any, bs: int, args: argparse.Namespace) -> dict[str, float]:
    """Prefill bs random prompts of args.context tokens, then eager and graph decode steps."""
    from radixserve.bench.one_batch import _batch
    from radixserve.engine.forward_batch import ForwardMode

    gen = torch.Generator().manual_seed(bs)
    prompts = torch.randint(0, args.vocab, (bs, args.context), generator=gen).tolist()
    rows = runner.req_to_token_pool.alloc(bs)
    if rows is None:
        raise RuntimeError(f"no {bs} free request rows")
    reqs = {"rows": rows, "prefix": [0] * bs, "extend": [args.context] * bs}
    reqs["input_ids"] = [t for p in prompts for t in p]
    logits = runner.forward(_batch(runner, ForwardMode.EXTEND, reqs)).next_token_logits
    ids = logits.argmax(-1).tolist()
    graphs, runner.graph_runner = runner.graph_runner, None
    decode_steps(runner, rows, ids, args.context, 2)  # warm-up (kernels compiled)
    eager_s, ids = decode_steps(runner, rows, ids, args.context + 2, args.steps)
    runner.graph_runner = graphs
    out, end = {"eager_tok_s": bs * args.steps / eager_s}, args.context + 2 + args.steps
    if graphs is not None:
        graph_s, _ = decode_steps(runner, rows, ids, end, args.steps)
        out["graph_tok_s"] = bs * args.steps / graph_s
        end += args.steps
    # give every slot and row back for the next batch size
    used = runner.req_to_token_pool.req_to_token[rows, :end]
    runner.allocator.free(used.flatten().to(torch.int64))
    for row in rows:
        runner.req_to_token_pool.free(row)
    return out


def hf_tok_s(hf: Any, bs: int, args: argparse.Namespace) -> float:
    """transformers generate's decode rate: (full run - prefill-only run) over the new tokens."""
    device = torch.device(args.device)
    gen = torch.Generator().manual_seed(bs)
    ids = torch.randint(0, args.vocab, (bs, args.context), generator=gen).to(device)
    mask = torch.ones_like(ids)

    def run(new: int) -> float:
        sync(device)
        t0 = time.perf_counter()
        with torch.inference_mode():
            hf.generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                do_sample=False, pad_token_id=0,
            )  # fmt: skip
        sync(device)
        return time.perf_counter() - t0

    run(2)  # warm-up
    return bs * args.steps / (run(args.steps + 1) - run(1))


def decode_rows(args: argparse.Namespace, bandwidth: float) -> list[dict[str, Any]]:
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    cfg = llama_config(args)
    hf = hf_model(cfg, device, dtype)
    runner = our_runner(cfg, hf, args)
    weights = weight_bytes_per_step(runner.model)
    rows = []
    for bs in args.batch_sizes:
        ours = ours_at(runner, bs, args)
        kv = bs * (args.context + args.steps) * kv_bytes_per_token(cfg, dtype)
        roofline = bs / ((weights + kv) / (bandwidth * 1e9))
        hf_rate = hf_tok_s(hf, bs, args) if args.hf else float("nan")
        best = max(ours.values())
        rows.append({
            "batch": bs, "context": args.context,
            "eager_tok_s": ours["eager_tok_s"], "graph_tok_s": ours.get("graph_tok_s", "-"),
            "roofline_tok_s": roofline, "best_vs_roofline": best / roofline,
            "hf_tok_s": hf_rate, "best_vs_hf": best / hf_rate,
        })  # fmt: skip
    runner.release_pools()
    return rows


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sections", default="bandwidth,parity,decode")
    p.add_argument("--device", default="cuda")
    p.add_argument("--parity-model", default="smollm2-135m")
    p.add_argument("--parity-tokens", type=int, default=32)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--backend", default="triton", help="decode section's attention backend")
    p.add_argument("--disable-fused-ops", action="store_true",
                   help="decode section: PyTorch norm/SiLU/rotary, not the Triton ops")  # fmt: skip
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--intermediate", type=int, default=14336)
    p.add_argument("--vocab", type=int, default=128256)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--steps", type=int, default=32, help="timed decode steps per mode")
    p.add_argument("--batch-sizes", type=lambda s: [int(x) for x in s.split(",")],
                   default=[1, 8, 64])  # fmt: skip
    p.add_argument("--no-hf", dest="hf", action="store_false", help="skip transformers")
    p.add_argument("--bandwidth-gib", type=float, default=2.0)
    p.add_argument("--output-file", default=None)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    sections = set(args.sections.split(","))
    device = torch.device(args.device)
    result: dict[str, Any] = {"device": torch.cuda.get_device_name() if device.type == "cuda"
                              else "cpu", "torch": torch.__version__}  # fmt: skip
    bandwidth = measure_bandwidth(device, args.bandwidth_gib)
    result["copy_bandwidth_gb_s"] = bandwidth
    print(f"copy bandwidth: {bandwidth:.0f} GB/s", flush=True)
    if "parity" in sections:
        result["parity"] = parity_rows(args.parity_model, device, args.parity_tokens)
        print_table(f"greedy parity ({args.parity_model}, vs torch eager)", result["parity"],
                    ("backend", "graphs", "identical", "prefix_agree", "seconds"))  # fmt: skip
    if "decode" in sections:
        result["decode"] = decode_rows(args, bandwidth)
        shape = f"{args.layers}L h{args.hidden} {args.heads}/{args.kv_heads} heads {args.dtype}"
        print_table(f"decode tok/s, random Llama {shape}, {args.backend}", result["decode"],
                    ("batch", "context", "eager_tok_s", "graph_tok_s", "roofline_tok_s",
                     "best_vs_roofline", "hf_tok_s", "best_vs_hf"))  # fmt: skip
    if args.output_file:
        Path(args.output_file).write_text(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
