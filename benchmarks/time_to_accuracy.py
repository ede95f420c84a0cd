"""Time to accuracy for benchmarks/vs_trl.py --eval-every: held-out accuracy against training seconds,
and the two sides compared at equal seconds.

A curve is one side's evaluation points in step order, each a dict
    {"step", "seconds", "accuracy", "correct", "n", "per_problem"}
where "seconds" is the training clock when that step ended (loop wall time minus saves and evaluation),
"per_problem" the greedy verdicts (0/1) on the held-out problems; the first point is the base model at
0 s, the last the final weights. streamrl's points also carry "wall_seconds": the loop's wall time
with its pauses counted (the asynchronous loop's rollout workers keep generating while the trainer
saves, so the training clock alone gets that generation free); the report repeats the comparison on it.
The arithmetic is pure (tests/test_vs_trl.py); the print_* functions show it.
"""

from __future__ import annotations

from typing import Any

from streamrl.eval.stats import paired_difference_interval, replicate_difference_interval

Point = dict[str, Any]
Curve = list[Point]


def point(step: int, seconds: float, verdicts: list[Any]) -> Point:
    """The evaluation point of the policy after `step` optimizer steps and `seconds` of training,
    from its per-problem verdicts."""
    v = [int(bool(c)) for c in verdicts]
    acc = sum(v) / max(len(v), 1)
    return {
        "step": step,
        "seconds": seconds,
        "accuracy": acc,
        "correct": sum(v),
        "n": len(v),
        "per_problem": v,
    }


def time_to_reach(curve: Curve, target: float) -> float | None:
    """Training seconds of the first point at or above `target` accuracy (None: never reached)."""
    return next((p["seconds"] for p in curve if p["accuracy"] >= target), None)


def point_at(curve: Curve, seconds: float) -> Point | None:
    """The policy a run had after `seconds` of training: its last point whose seconds are <= them."""
    within = [p for p in curve if p["seconds"] <= seconds]
    return within[-1] if within else None


def speedup(fast: Curve, ref: Curve) -> float | None:
    """ref's final training seconds / the seconds `fast` needs to reach ref's final accuracy.
    None when `fast` never reaches it, or already does at 0 s (its base model)."""
    final = ref[-1]
    reach = time_to_reach(fast, final["accuracy"])
    return final["seconds"] / reach if reach else None


def equal_time(a: Curve, b: Curve) -> tuple[float, Point, Point]:
    """(T, a's point at T, b's point at T) for T = the shorter of the two final training times."""
    t = min(a[-1]["seconds"], b[-1]["seconds"])
    pa, pb = point_at(a, t), point_at(b, t)
    assert pa is not None and pb is not None, "a curve starts at 0 s"
    return t, pa, pb


def pauses_counted(curve: Curve) -> Curve | None:
    """The curve on its loop's wall clock: each point's "wall_seconds" as its seconds (None when a
    point lacks them)."""
    if not all("wall_seconds" in p for p in curve):
        return None
    return [{**p, "seconds": p["wall_seconds"]} for p in curve]


def _brief(p: Point | None) -> dict[str, Any] | None:
    return None if p is None else {k: p[k] for k in ("step", "seconds", "accuracy")}


def compare(streamrl: Curve, trl: Curve, target: float | None) -> dict[str, Any]:
    """One seed's comparison: time to `target`, each side's accuracy at the other's final training
    time, the speed-up to TRL's final accuracy, and both at the shorter final time."""
    t, ps, pt = equal_time(streamrl, trl)
    return {
        "target": target,
        "seconds_to_target": None
        if target is None
        else {"streamrl": time_to_reach(streamrl, target), "trl": time_to_reach(trl, target)},
        "streamrl_at_trl_final": _brief(point_at(streamrl, trl[-1]["seconds"])),
        "trl_at_streamrl_final": _brief(point_at(trl, streamrl[-1]["seconds"])),
        "trl_final": _brief(trl[-1]),
        "streamrl_final": _brief(streamrl[-1]),
        "streamrl_seconds_to_trl_final": time_to_reach(streamrl, trl[-1]["accuracy"]),
        "speedup_to_trl_final": speedup(streamrl, trl),
        "equal_time": {"seconds": t, "streamrl": _brief(ps), "trl": _brief(pt)},
    }


def pooled_equal_time(pairs: list[tuple[Curve, Curve]]) -> dict[str, Any]:
    """Over seeds ((streamrl, trl) curves of each): both sides at each seed's shorter final time, the
    verdicts pooled, and streamrl - TRL with its paired 95% interval (the same problems per seed) and
    its interval over seeds (Student's t: the run-to-run spread of training included)."""
    s_runs: list[list[bool]] = []
    t_runs: list[list[bool]] = []
    for streamrl, trl in pairs:
        _, ps, pt = equal_time(streamrl, trl)
        if len(ps["per_problem"]) != len(pt["per_problem"]):
            raise ValueError("the two sides were evaluated on different numbers of held-out problems")
        s_runs.append([bool(c) for c in ps["per_problem"]])
        t_runs.append([bool(c) for c in pt["per_problem"]])
    s_all, t_all = sum(s_runs, []), sum(t_runs, [])
    mean, lo, hi = paired_difference_interval(t_all, s_all)  # after - before = streamrl - TRL
    _, seeds_lo, seeds_hi = replicate_difference_interval(t_runs, s_runs)
    return {
        "streamrl": [sum(s_all), len(s_all)],
        "trl": [sum(t_all), len(t_all)],
        "difference": mean,
        "ci95": [lo, hi],
        "ci95_over_seeds": [seeds_lo, seeds_hi],
    }


# ---- printing -------------------------------------------------------------------------------------


def _seconds(s: float | None) -> str:
    return "not reached" if s is None else f"{s:.1f} s"


def print_curves(curves: dict[str, Curve]) -> None:
    print("  held-out accuracy (greedy) at each evaluation, against training seconds:")
    for side, curve in curves.items():
        for p in curve:
            print(
                f"    {side:9s} step {p['step']:4d}  {p['seconds']:8.1f} s  {p['accuracy']:.3f} "
                f"({p['correct']}/{p['n']})"
            )


def print_comparison(c: dict[str, Any]) -> None:
    if c["target"] is not None:
        to = c["seconds_to_target"]
        print(f"  time to {c['target']:.3f}: streamrl {_seconds(to['streamrl'])}, TRL {_seconds(to['trl'])}")
    sf, tf = c["streamrl_final"], c["trl_final"]
    s_at, t_at = c["streamrl_at_trl_final"], c["trl_at_streamrl_final"]
    print(
        f"  at TRL's final {tf['seconds']:.1f} s: streamrl {s_at['accuracy']:.3f} (step {s_at['step']}), "
        f"TRL {tf['accuracy']:.3f} (step {tf['step']})"
    )
    print(
        f"  at streamrl's final {sf['seconds']:.1f} s: streamrl {sf['accuracy']:.3f} (step {sf['step']}), "
        f"TRL {t_at['accuracy']:.3f} (step {t_at['step']})"
    )
    reach, up = c["streamrl_seconds_to_trl_final"], c["speedup_to_trl_final"]
    if up is not None:
        how = f"{up:.2f}x sooner" if up >= 1 else f"{1 / up:.2f}x later"
        print(
            f"  TRL's final accuracy {tf['accuracy']:.3f} reached {how} by streamrl "
            f"({reach:.1f} s vs {tf['seconds']:.1f} s)"
        )
    elif reach is None:
        print(f"  TRL's final accuracy {tf['accuracy']:.3f}: not reached by streamrl")
    else:
        print(f"  TRL's final accuracy {tf['accuracy']:.3f}: streamrl's base model already has it")


def print_pooled(p: dict[str, Any], seeds: int) -> None:
    (c1, n1), (c2, n2) = p["streamrl"], p["trl"]
    lo, hi = p["ci95"]
    print(
        f"  held-out accuracy at equal training seconds (each seed's shorter final time), pooled over "
        f"{seeds} run(s): streamrl {c1}/{n1} = {c1 / max(n1, 1):.1%}, "
        f"TRL {c2}/{n2} = {c2 / max(n2, 1):.1%}; difference {p['difference']:+.1%} "
        f"(paired 95% CI {lo:+.1%} .. {hi:+.1%}{_over_seeds(p)})"
    )


def _over_seeds(p: dict[str, Any]) -> str:
    lo, hi = p["ci95_over_seeds"]
    return "" if lo == float("-inf") else f"; over seeds {lo:+.1%} .. {hi:+.1%}"


def report(pairs: dict[str, dict[str, dict[str, Any]]], target: float | None) -> dict[str, Any] | None:
    """Print and return the time-to-accuracy comparison of each run (a seed, or "run" without --seeds)
    and the pooled accuracy at equal training seconds; None unless both sides have curves."""
    both = {k: r for k, r in pairs.items() if {"streamrl", "trl"} <= set(r)}
    if not both or any(r[s].get("curve") is None for r in both.values() for s in ("streamrl", "trl")):
        return None
    per_run = {}
    for name, r in both.items():
        curves = {"streamrl": r["streamrl"]["curve"], "trl": r["trl"]["curve"]}
        print(f"\n[vs_trl] time to accuracy, {name}:")
        print_curves(curves)
        per_run[name] = compare(curves["streamrl"], curves["trl"], target)
        print_comparison(per_run[name])
    pooled = pooled_equal_time([(r["streamrl"]["curve"], r["trl"]["curve"]) for r in both.values()])
    print_pooled(pooled, len(both))
    paused = {s: sum(r[s].get("paused_s", 0.0) for r in both.values()) for s in ("streamrl", "trl")}
    print(
        f"  left out of the training clocks (saves, exports, periodic evaluation): streamrl "
        f"{paused['streamrl']:.1f} s (async: its rollout workers kept generating meanwhile), "
        f"TRL {paused['trl']:.1f} s"
    )
    out: dict[str, Any] = {"per_run": per_run, "pooled_equal_time": pooled}
    counted = {name: pauses_counted(r["streamrl"]["curve"]) for name, r in both.items()}
    if all(c is not None for c in counted.values()):
        out["pauses_counted"] = report_pauses_counted(
            {name: (c, both[name]["trl"]["curve"]) for name, c in counted.items() if c is not None}
        )
    return out


def report_pauses_counted(pairs: dict[str, tuple[Curve, Curve]]) -> dict[str, Any]:
    """The speed-up to TRL's final accuracy and the pooled equal-seconds difference again, streamrl's
    seconds being its loop's wall time (its pauses counted, TRL's still left out)."""
    ups = {name: speedup(s, t) for name, (s, t) in pairs.items()}
    pooled = pooled_equal_time(list(pairs.values()))
    shown = ", ".join(f"{name} {'-' if u is None else f'{u:.2f}x'}" for name, u in ups.items())
    lo, hi = pooled["ci95"]
    print(
        f"  with streamrl's pauses counted in its clock: TRL's final accuracy reached sooner by {shown}; "
        f"at equal seconds {pooled['difference']:+.1%} (paired 95% CI {lo:+.1%} .. {hi:+.1%}"
        f"{_over_seeds(pooled)})"
    )
    return {"speedup_to_trl_final": ups, "pooled_equal_time": pooled}
