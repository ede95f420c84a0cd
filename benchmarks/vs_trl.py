"""streamrl vs TRL's GRPOTrainer on the same job, in one invocation.

    python benchmarks/vs_trl.py [--model smollm2|tiny] [--steps 10] [--budget-s 0] [--eval-size N]
                                [--set KEY=VALUE ...] [--streamrl-set KEY=VALUE ...] [--out results.json]
                                [--seeds 0,1,2] [--eval-every K [--time-to-accuracy TARGET]]

The job is streamrl's default (src/streamrl/config.py; README "What make demo does"): SmolLM2-135M-Instruct
(or the tiny random model), task rg:chain_sum, 8 prompts x 8 samples per optimizer step,
rollout.max_new_tokens, temperature, AdamW lr 2e-5, clip 0.2 / 0.28, token-mean, GRPO advantages, no KL.
`--set` changes the job for both sides; `--streamrl-set` only streamrl (e.g. rollout.dynamic_sampling=false).

Each side runs in its own fresh subprocess, one after the other (never both at once on a small machine):
  streamrl  run_train(cfg), the code path of `streamrl train` (async: a rollout worker process + trainer)
  trl       GRPOTrainer + GRPOConfig(use_cpu=True), no vLLM: the same converted weights, the same chat
            messages of the same training problems in the same order, streamrl's scorer as the reward
            function, the hyper-parameters mapped by benchmarks/trl_settings.py.
Both stop after --steps optimizer steps or, with --budget-s > 0, once that much training wall time is spent
(whichever first), then are evaluated greedily by streamrl's eval/heldout.py on the same held-out problems.

Measured per side: samples/s, generated tokens/s, trained tokens/s (all over the training clock: the
loop's wall time minus state saves, checkpoint exports and periodic evaluation; and the samples actually
trained), rollout samples/s (every sample generated, incl. the groups streamrl's
dynamic sampling dropped; = samples/s for TRL), wall time of the whole subprocess, peak memory of its
process tree (sum of RSS, and of PSS which counts shared pages once, sampled every 0.5 s; plus the
largest single process from wait4), held-out accuracy before/after. The table ends with the ratio
streamrl / TRL.

Settings that cannot be matched exactly are printed before the runs (trl_settings.unmatched_settings):
async vs synchronous execution, streamrl's engine vs transformers `generate`, thread split, the decoupled
PPO behaviour weight, advantage eps, sampling RNG, micro-batch packing, worker start-up inside streamrl's
training time, and DAPO dynamic sampling (on in streamrl's default job, absent in TRL; with the tiny
random model every reward is 0, so it spends up to 8x the samples per step: see "rollout smp/s").
The TRL side checks that its prompt token ids equal streamrl's (printed; `prompt_ids_identical`).

Time to accuracy, `--eval-every K`: each side also saves its policy every K optimizer steps with its
training clock paused (streamrl: checkpoint.every=K, the clock is `train_elapsed` in metrics.jsonl; TRL:
trainer.save_model from a callback) and, after training, evaluates every saved policy greedily on the same
held-out problems as the final evaluation (outside the training clock). Per side and seed it prints the
accuracy at each point (the base model at 0 s, every K-th step, the final weights) with its training
seconds; then each side's accuracy at the other's final training time, and how much sooner streamrl
reached TRL's final accuracy (TRL's training seconds / the seconds of streamrl's first point at or above
it). `--time-to-accuracy TARGET` (a fraction, e.g. 0.4) adds the seconds each side needs to reach TARGET
(its first point at or above it, or "not reached"). Pooled over the runs (seeds): both sides' held-out
accuracy at equal training seconds (each seed's shorter final time; each side's last point within it)
and streamrl - TRL with a paired 95% interval over the problems. The arithmetic is
benchmarks/time_to_accuracy.py. Only points are compared: a policy between two points is not known,
so a coarse K rounds each side's time up to its next point. --budget-s still counts the loop's wall
time, saves included, on both sides (streamrl's max_time).

trl is a benchmark-only dependency: pip install 'streamrl[bench]'.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MODELS = {"smollm2": "smollm2-135m-instruct", "tiny": "tiny-random"}
METRICS = [  # (key, header, format)
    ("steps", "steps", "{:.0f}"),
    ("samples_per_s", "samples/s", "{:.2f}"),
    ("rollout_samples_per_s", "rollout smp/s", "{:.2f}"),
    ("gen_tokens_per_s", "gen tok/s", "{:.1f}"),
    ("trained_tokens_per_s", "train tok/s", "{:.1f}"),
    ("train_s", "train s", "{:.1f}"),
    ("wall_s", "wall s", "{:.1f}"),
    ("peak_rss_mb", "RSS MB", "{:.0f}"),
    ("peak_pss_mb", "PSS MB", "{:.0f}"),
    ("acc_before", "acc before", "{:.3f}"),
    ("acc_after", "acc after", "{:.3f}"),
]


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=sorted(MODELS), default="smollm2")
    p.add_argument("--steps", type=int, default=10, help="optimizer steps per side (the cap with --budget-s)")
    p.add_argument("--budget-s", type=float, default=0.0, help="training wall time per side (0: none)")
    p.add_argument("--eval-size", type=int, default=None, help="held-out problems (default: eval.size)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="job override, both sides")
    p.add_argument(
        "--streamrl-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override for the streamrl side only",
    )
    p.add_argument("--sides", default="streamrl,trl", help="comma list of the sides to run")
    p.add_argument(
        "--seeds",
        default="",
        help="comma list of seeds: both sides once per seed (--set seed=S), then a pooled summary",
    )
    p.add_argument(
        "--eval-every",
        type=int,
        default=0,
        metavar="K",
        help="save and, after training, evaluate each side's policy every K optimizer steps (0: off)",
    )
    p.add_argument(
        "--time-to-accuracy",
        type=float,
        default=None,
        metavar="TARGET",
        help="held-out accuracy (0..1) whose training seconds each side reports; needs --eval-every",
    )
    p.add_argument("--out", default="", help="results JSON (default: WORKDIR/results.json)")
    p.add_argument("--workdir", default="", help="run directories (default: a new temp dir)")
    p.add_argument("--side", choices=["streamrl", "trl"], help=argparse.SUPPRESS)  # internal: child mode
    p.add_argument("--result", default="", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def argument_error(args: argparse.Namespace) -> str | None:
    """The first bad option as one line naming it and the fix (None: all good)."""
    if args.eval_every < 0:
        return f"--eval-every {args.eval_every}: give K >= 1 optimizer steps between evaluations (0: off)"
    target = args.time_to_accuracy
    if target is not None and not 0.0 <= target <= 1.0:
        return f"--time-to-accuracy {target:g}: give the held-out accuracy as a fraction, e.g. 0.4"
    if target is not None and args.eval_every == 0:
        return "--time-to-accuracy needs --eval-every K (evaluate each side every K optimizer steps)"
    return None


def job_overrides(args: argparse.Namespace) -> list[str]:
    return [f"model={MODELS[args.model]}", *args.set]


# ---- child: one side in this process ---------------------------------------------------------------


def child(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(HERE))
    from vs_trl_sides import job_config, run_streamrl, run_trl

    extra = args.streamrl_set if args.side == "streamrl" else []
    cfg = job_config([*job_overrides(args), *extra], args.steps, args.budget_s, args.eval_size)
    work = Path(args.workdir)
    run = run_streamrl if args.side == "streamrl" else run_trl
    result = run(cfg, work, args.eval_every)
    Path(args.result).write_text(json.dumps(result, indent=2))


# ---- parent: run the sides, measure, compare --------------------------------------------------------


class TreeMemory:
    """Peak summed RSS and PSS of a process and its descendants, sampled every `interval` seconds."""

    def __init__(self, pid: int, interval: float = 0.5) -> None:
        import psutil

        self.root = psutil.Process(pid)
        self.interval = interval
        self.peak_rss = self.peak_pss = 0
        self.max_procs = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        import psutil

        try:
            procs = [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            return
        rss = pss = 0
        for proc in procs:
            try:
                info = proc.memory_full_info()  # PSS reads smaps_rollup: shared pages split between sharers
                rss += info.rss
                pss += getattr(info, "pss", info.rss)
            except psutil.Error:
                continue
        self.peak_rss, self.peak_pss = max(self.peak_rss, rss), max(self.peak_pss, pss)
        self.max_procs = max(self.max_procs, len(procs))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def run_side(side: str, args: argparse.Namespace, work: Path, argv: list[str]) -> dict[str, Any]:
    """Run one side in a fresh subprocess; its result JSON plus wall time and peak memory."""
    result_path = work / f"{side}.json"
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        *argv,
        "--side",
        side,
        "--result",
        str(result_path),
        "--workdir",
        str(work),
    ]
    print(f"\n[vs_trl] === {side}: starting a fresh process ===", flush=True)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd)
    memory = TreeMemory(proc.pid)
    _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage (not other sides')
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    memory.stop()
    if proc.returncode != 0:
        raise SystemExit(f"[vs_trl] the {side} side failed (exit {proc.returncode}); see its output above")
    res = json.loads(result_path.read_text())
    train_s = max(res["train_s"], 1e-9)
    res.update(
        wall_s=wall,
        peak_rss_mb=memory.peak_rss / 2**20,
        peak_pss_mb=memory.peak_pss / 2**20,
        max_process_rss_mb=usage.ru_maxrss / 1024,  # KiB on Linux: the largest single process waited for
        processes=memory.max_procs,
        samples_per_s=res["samples"] / train_s,
        rollout_samples_per_s=res["rollout_samples"] / train_s,
        gen_tokens_per_s=res["gen_tokens"] / train_s,
        trained_tokens_per_s=res["trained_tokens"] / train_s,
        acc_before=(res.get("before") or {}).get("accuracy"),
        acc_after=(res.get("after") or {}).get("accuracy"),
    )
    print(f"[vs_trl] {side}: {res['steps']} steps, train {train_s:.1f} s, wall {wall:.1f} s", flush=True)
    return res


def _cell(value: Any, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def ratios(streamrl: dict[str, Any], trl: dict[str, Any]) -> dict[str, float | None]:
    """streamrl / TRL for each metric of the table (None when TRL's value is 0 or missing)."""
    out: dict[str, float | None] = {}
    for key, _, _ in METRICS:
        a, b = streamrl.get(key), trl.get(key)
        out[key] = a / b if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None
    return out


def print_table(results: dict[str, dict[str, Any]], ratio: dict[str, float | None] | None) -> None:
    width = max(len(h) for _, h, _ in METRICS) + 1
    names = list(results) + (["streamrl/TRL"] if ratio else [])
    print("\n" + "metric".ljust(width) + "".join(n.rjust(14) for n in names))
    for key, header, fmt in METRICS:
        cells = [_cell(results[n].get(key), fmt) for n in results]
        if ratio:
            cells.append(_cell(ratio[key], "{:.2f}x"))
        print(header.ljust(width) + "".join(c.rjust(14) for c in cells))


def _pair_ratio(results: dict[str, dict[str, Any]]) -> dict[str, float | None] | None:
    return ratios(results["streamrl"], results["trl"]) if {"streamrl", "trl"} <= set(results) else None


def pooled(side_runs: list[dict[str, Any]]) -> tuple[int, int]:
    """(correct, n) of the held-out evaluations after training, summed over seeds."""
    after = [r.get("after") or {} for r in side_runs]
    return sum(int(a.get("correct", 0)) for a in after), sum(int(a.get("n", 0)) for a in after)


def accuracy_diff_ci(c1: int, n1: int, c2: int, n2: int, z: float = 1.96) -> tuple[float, float, float]:
    """p1 - p2 and its normal-approximation 95% interval (two independent binomial samples)."""
    p1, p2 = c1 / max(n1, 1), c2 / max(n2, 1)
    se = (p1 * (1 - p1) / max(n1, 1) + p2 * (1 - p2) / max(n2, 1)) ** 0.5
    return p1 - p2, p1 - p2 - z * se, p1 - p2 + z * se


def seed_summary(runs: dict[int, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """Print and return the per-seed samples/s ratios, the ratio of mean samples/s and the pooled
    held-out accuracies of both sides with the 95% interval of their difference."""
    seeds = list(runs)
    per_seed = {s: runs[s]["streamrl"]["samples_per_s"] / runs[s]["trl"]["samples_per_s"] for s in seeds}
    mean = {
        side: sum(runs[s][side]["samples_per_s"] for s in seeds) / len(seeds) for side in ("streamrl", "trl")
    }
    (c1, n1), (c2, n2) = pooled([runs[s]["streamrl"] for s in seeds]), pooled([runs[s]["trl"] for s in seeds])
    diff, lo, hi = accuracy_diff_ci(c1, n1, c2, n2)
    print(f"\n[vs_trl] over {len(seeds)} seeds ({', '.join(map(str, seeds))}):")
    print("  samples/s ratio per seed: " + ", ".join(f"{s}: {r:.2f}x" for s, r in per_seed.items()))
    print(
        f"  mean samples/s: streamrl {mean['streamrl']:.2f}, TRL {mean['trl']:.2f} "
        f"({mean['streamrl'] / mean['trl']:.2f}x; min per seed {min(per_seed.values()):.2f}x)"
    )
    print(
        f"  held-out accuracy after the budget, pooled: streamrl {c1}/{n1} = {c1 / max(n1, 1):.1%}, "
        f"TRL {c2}/{n2} = {c2 / max(n2, 1):.1%}; difference {diff:+.1%} (95% CI {lo:+.1%} .. {hi:+.1%})"
    )
    return {
        "per_seed_samples_ratio": per_seed,
        "mean_samples_per_s": mean,
        "samples_ratio_of_means": mean["streamrl"] / mean["trl"],
        "pooled_accuracy": {"streamrl": [c1, n1], "trl": [c2, n2]},
        "accuracy_diff": diff,
        "accuracy_diff_ci95": [lo, hi],
    }


def settings_report(args: argparse.Namespace) -> tuple[dict[str, Any], list[str]]:
    """(GRPOConfig fields for the job, unmatched settings) without importing torch or trl."""
    sys.path.insert(0, str(HERE))
    from trl_settings import grpo_config_kwargs, unmatched_settings
    from vs_trl_sides import job_config

    cfg = job_config([*job_overrides(args), *args.streamrl_set], args.steps, args.budget_s, args.eval_size)
    samples = cfg.rollout.prompts_per_step * cfg.rollout.samples_per_prompt
    fields = grpo_config_kwargs(cfg, args.steps, samples, "-")  # micro-batch: chosen in the TRL child
    for k in ("output_dir", "per_device_train_batch_size", "gradient_accumulation_steps"):
        fields.pop(k)
    return fields, unmatched_settings(cfg)


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    if (error := argument_error(args)) is not None:
        print(f"vs_trl: error: {error}", file=sys.stderr)
        raise SystemExit(2)
    if args.side:
        child(args)
        return
    sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    if "trl" in sides and importlib.util.find_spec("trl") is None:
        raise SystemExit("vs_trl: trl is not installed: pip install 'streamrl[bench]'")
    if importlib.util.find_spec("psutil") is None:
        raise SystemExit("vs_trl: psutil is not installed (peak memory of each side): pip install psutil")
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="vs-trl-"))
    work.mkdir(parents=True, exist_ok=True)
    fields, unmatched = settings_report(args)
    from time_to_accuracy import report as tta_report  # benchmarks/ is on sys.path from here on

    print(
        f"[vs_trl] model {MODELS[args.model]}, {args.steps} steps"
        + (f" or {args.budget_s:.0f} s of training" if args.budget_s else "")
        + f", work dir {work}"
    )
    print("[vs_trl] TRL GRPOConfig (besides the micro-batch split):")
    print("  " + ", ".join(f"{k}={v}" for k, v in fields.items()))
    print("[vs_trl] not matched exactly:")
    for line in unmatched:
        print(f"  - {line}")
    seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
    summary = tta = None
    if seeds:
        runs: dict[int, dict[str, dict[str, Any]]] = {}
        ratio: Any = {}
        for seed in seeds:
            seed_work = work / f"seed{seed}"
            seed_work.mkdir(parents=True, exist_ok=True)
            runs[seed] = {
                side: run_side(side, args, seed_work, [*argv, "--set", f"seed={seed}"]) for side in sides
            }
            ratio[str(seed)] = _pair_ratio(runs[seed])
            print(f"\n[vs_trl] seed {seed}:")
            print_table(runs[seed], ratio[str(seed)])
        results = {side: {str(s): runs[s][side] for s in seeds} for side in sides}
        if {"streamrl", "trl"} <= set(sides):
            summary = seed_summary(runs)
        tta = tta_report({f"seed {s}": runs[s] for s in seeds}, args.time_to_accuracy)
    else:
        # the child's --workdir comes last
        results = {side: run_side(side, args, work, argv) for side in sides}
        ratio = _pair_ratio(results)
        print_table(results, ratio)
        tta = tta_report({"run": results}, args.time_to_accuracy)
    out = Path(args.out) if args.out else work / "results.json"
    payload = {
        "model": MODELS[args.model],
        "steps": args.steps,
        "budget_s": args.budget_s,
        "eval_every": args.eval_every,
        "overrides": args.set,
        "streamrl_overrides": args.streamrl_set,
        "grpo_config": fields,
        "unmatched": unmatched,
        "results": results,
        "ratio_streamrl_over_trl": ratio,  # with --seeds: one per seed
        "seed_summary": summary,
        "time_to_accuracy": tta,
    }
    out.write_text(json.dumps(payload, indent=2, default=str))
    print(f"\n[vs_trl] results: {out}")


if __name__ == "__main__":
    main(sys.argv[1:])
