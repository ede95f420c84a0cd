"""Speculative rollouts in continuous batching, plainly and with drafts: the rollout worker's steady state.

    python benchmarks/spec_continuous.py [--model DIR_OR_NAME] [--prompts 32] [--samples 8]
        [--inflight 16] [--epochs 3] [--drafts 8] [--unpacked-too 0]

A ContinuousDecoder keeps --inflight groups of --samples samples in flight, as the rollout worker does
under the staleness bound: as soon as a group's last sample finishes, the next prompt's group joins the
running batch. --prompts held-out rg:chain_sum prompts come round once per epoch; with drafts each
group offers its prompt's last --drafts responses (the first epoch has none). Both arms run the same epochs
one after the other on the same weights, one thread. Prints each arm's tokens per second from the second
epoch's first group to the last group's admission (the steady state: the groups in flight that remain
then are not drained), the forwards it ran (decode steps, those of them that carry joining requests'
prefills (engine/packed.py), and prefills run alone, with the drafts' trees when there are drafts)
with their time, the acceptance rate, and how many samples and groups were answered inside their
drafts' tree (the rest decode on after verification). --unpacked-too 1 runs each arm a second time
with every prefill run alone, and prints packed / unpacked. Not a test: figures, not assertions.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections import defaultdict

import torch

from benchmarks.spec_engine import engine_job
from streamrl.engine import continuous
from streamrl.engine.base import Draft, GenRequest, GenResult
from streamrl.engine.continuous import ContinuousDecoder
from streamrl.engine.hf import HFEngine
from streamrl.engine.packed import Segment


class ForwardClock:
    """Every forward of the model by kind (one column: a decode step; more: a prefill, with the drafts'
    trees if any; packed: a decode step that carries joining requests' prefill, engine/packed.py),
    with its rows, columns and seconds (packed: 1 row of all the tokens). A prefill with a tree calls
    the decoder alone (the LM head then runs on the nodes rows reach, outside the clock): those calls
    count as well."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.shapes: defaultdict[str, list[tuple[int, int, float]]] = defaultdict(list)
        self._open: list[tuple[int, int, float]] = []  # forwards under way (the model's, the decoder's)
        for module in (model, model.get_decoder()):
            module.register_forward_pre_hook(self._pre, with_kwargs=True)
            module.register_forward_hook(self._post, with_kwargs=True)
        packed = continuous.packed_hidden

        def timed_packed(model: torch.nn.Module, segments: list[Segment], device: object) -> list:
            t0 = time.perf_counter()
            out = packed(model, segments, device)
            self.shapes["packed"].append((1, sum(s.tokens for s in segments), time.perf_counter() - t0))
            return out

        continuous.packed_hidden = timed_packed

    def _pre(self, _m: object, args: tuple, kwargs: dict) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        shape = (int(ids.shape[0]), int(ids.shape[1])) if ids is not None else (0, 0)
        self._open.append((*shape, time.perf_counter()))

    def _post(self, _m: object, _a: tuple, _k: dict, _out: object) -> None:
        rows, cols, t0 = self._open.pop()
        if not self._open:  # the outermost: a decoder called by the model is inside the model's forward
            kind = "decode" if cols == 1 else "multi"
            self.shapes[kind].append((rows, cols, time.perf_counter() - t0))

    def count(self, kind: str) -> int:
        return len(self.shapes[kind])

    def seconds(self, kind: str) -> float:
        return sum(t for _, _, t in self.shapes[kind])

    def reset(self) -> None:
        self.shapes.clear()


def decoded_after_tree(res: GenResult) -> int:
    """The tokens a response decoded after verification: past its longest prefix that is a path of its
    drafts' tree, and the one token verification emits beyond it (0: answered inside the tree)."""
    prefixes = {d.token_ids[:i] for d in res.request.drafts for i in range(1, len(d.token_ids) + 1)}
    ids = tuple(res.token_ids)
    path = max((i for i in range(1, len(ids) + 1) if ids[:i] in prefixes), default=0)
    return max(0, len(ids) - path - 1)


def run_arm(
    engine: HFEngine, prompts: list[list[int]], args: argparse.Namespace, drafts_on: bool, clock: ForwardClock
) -> dict[str, float]:
    """One arm over --epochs epochs; figures from the second epoch's first group on."""
    samples, inflight, epochs = args.samples, args.inflight, args.epochs
    decoder = ContinuousDecoder(engine)
    store: dict[int, tuple[Draft, ...]] = {}
    todo = [p for _ in range(epochs) for p in range(len(prompts))]
    open_: dict[int, list[GenResult]] = {}
    n_groups = 0
    tokens = verified = accepted = 0
    tails: list[int] = []  # per group with drafts: its samples' most decode steps after verification
    inside = 0  # samples answered inside their prompt's draft tree
    t_start = 0.0
    measuring = False

    def admit() -> None:
        nonlocal n_groups
        p = todo.pop(0)
        gid = n_groups
        n_groups += 1
        drafts = store.get(p, ()) if drafts_on else ()
        new = GenRequest(prompts[p], args.max_new_tokens, 1.0, 1.0, (gid, p), drafts)
        decoder.add([dataclasses.replace(new) for _ in range(samples)])
        open_[gid] = []

    while len(open_) < inflight and todo:
        admit()
    while open_:
        if not measuring and n_groups > len(prompts):  # the second epoch's first group has joined
            measuring, t_start = True, time.perf_counter()
            clock.reset()
            tokens = verified = accepted = inside = 0
            tails.clear()
        for res in decoder.step():
            gid, p = res.request.tag
            tokens += len(res.token_ids)
            verified += res.draft_tokens
            accepted += res.draft_accepted
            open_[gid].append(res)
            if len(open_[gid]) == samples:
                group = open_.pop(gid)
                if measuring and group[0].request.drafts:
                    left = [decoded_after_tree(r) for r in group]
                    tails.append(max(left))
                    inside += sum(n == 0 for n in left)
                fresh = tuple(Draft(tuple(r.token_ids), tuple(r.logprobs)) for r in group)
                store[p] = (fresh + store.get(p, ()))[: args.drafts]
                if todo:
                    admit()
        if not todo:  # the last group has been admitted: the drain that follows is no steady state
            break
    wall = time.perf_counter() - t_start
    return {
        "tok_s": tokens / wall,
        "tokens": tokens,
        "wall": wall,
        "acceptance": accepted / max(verified, 1),
        "from_drafts": accepted / max(tokens, 1),
        "decode_n": clock.count("decode"),
        "decode_s": clock.seconds("decode"),
        "multi_n": clock.count("multi"),
        "multi_s": clock.seconds("multi"),
        "packed_n": clock.count("packed"),
        "packed_s": clock.seconds("packed"),
        "inside": inside / max(len(tails) * samples, 1),
        "groups_inside": sum(t == 0 for t in tails) / max(len(tails), 1),
        "tail_median": statistics.median(tails) if tails else 0,
        "tail_max": max(tails, default=0),
        "decode_rows": sum(r for r, _, _ in clock.shapes["decode"]) / max(clock.count("decode"), 1),
        "multi_tokens": sum(r * c for r, c, _ in clock.shapes["multi"]) / max(clock.count("multi"), 1),
    }


def main() -> None:
    args, engine, prompts = engine_job(
        __doc__, {"--inflight": 16, "--epochs": 3, "--drafts": 8, "--unpacked-too": 0}
    )
    engine.packs()  # its one-time check, before the clock
    clock = ForwardClock(engine.model)
    out = {}
    packings = (False, True) if args.unpacked_too else (engine.packs(),)
    for arm in (False, True):
        for pack in packings:
            torch.manual_seed(0)
            engine.generator.manual_seed(0)
            engine.pack = pack
            out[arm, pack] = r = run_arm(engine, prompts, args, arm, clock)
            name = ("spec " if arm else "plain") + ("" if pack else ", unpacked")
            print(
                f"{name}: {r['tok_s']:6.1f} tok/s ({r['tokens']} tokens in {r['wall']:.1f} s)  decode steps "
                f"{r['decode_n'] + r['packed_n']} ({r['decode_s'] + r['packed_s']:.1f} s, of which "
                f"{r['packed_n']} carry a prefill), {r['decode_rows']:.1f} rows each  prefills alone "
                f"{r['multi_n']} ({r['multi_s']:.1f} s, {r['multi_tokens']:.0f} tokens each)  "
                f"acceptance {r['acceptance']:.2f}  from drafts {r['from_drafts']:.2f}",
                flush=True,
            )
            if arm:
                print(
                    f"       answered inside the drafts' tree: {r['inside']:.0%} of samples, "
                    f"{r['groups_inside']:.0%} of groups; a group's decode steps after verification: "
                    f"median {r['tail_median']:g}, max {r['tail_max']}",
                    flush=True,
                )
    for pack in packings:
        ratio = out[True, pack]["tok_s"] / out[False, pack]["tok_s"]
        print(f"spec / plain{'' if pack else ', unpacked'}: {ratio:.2f}x")
    if args.unpacked_too:
        for arm in (False, True):
            ratio = out[arm, True]["tok_s"] / out[arm, False]["tok_s"]
            print(f"{'spec' if arm else 'plain'}: packed / unpacked {ratio:.2f}x")


if __name__ == "__main__":
    main()
