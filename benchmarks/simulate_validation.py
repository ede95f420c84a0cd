"""Predicted vs measured samples/s of real runs (the simulator against metrics.jsonl).

    python benchmarks/simulate_validation.py RUN_DIR [RUN_DIR ...] [--decode-from RUN_DIR] [--cores N]
                                             [--measured THREAD_SCALING.json] [--shared-prefill]

self: costs fitted on the run itself (in-sample: only the schedule - overlap, staleness admission,
thread split - is predicted). cross (with --decode-from, e.g. a colocated sync run): decode costs come
from that other run, so async runs are predicted from a synchronous one's generation speed.
--measured: the JSON of benchmarks/thread_scaling.py. Its thread-scaling exponents (decode_thread_scaling,
thread_scaling; default 1 for both) carry a cost fitted at one thread count to another (a colocated run's
2-thread decoding to an async worker's 1 thread) in every fit, and it adds two rows per run. bench: decode
costs measured by that benchmark on an idle machine (per-step, per-row and prefill costs at 1 thread),
training costs fitted on the run. scaled: the same costs' proportions, scaled so the simulated engine is
busy as long as the run's was (what contention on a loaded machine adds; sim/fit.py).
--shared-prefill: the self/cross fits count a group's prompt once (as the engine computes it) instead of
once per sample.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from streamrl.sim import fit
from streamrl.sim.model import simulate


def main(argv: list[str]) -> None:
    dirs, source, decode_from, cores = [], "", None, 2
    alpha, decode_alpha, engine, shared = 1.0, None, None, False
    it = iter(argv)
    for a in it:
        if a == "--decode-from":
            source = next(it)
        elif a == "--cores":
            cores = int(next(it))
        elif a == "--shared-prefill":
            shared = True
        elif a == "--measured":
            m = json.loads(Path(next(it)).read_text())
            alpha, decode_alpha = m["thread_scaling"], m["decode_thread_scaling"]
            engine = fit.EngineCosts(**m["engine_costs"]["1"])
            print(
                f"measured: train alpha {alpha:.2f}, decode alpha {decode_alpha:.2f}; 1-thread engine: step "
                f"{engine.decode_step_s * 1e3:.1f} ms + {engine.decode_token_s * 1e3:.2f} ms x rows, prefill "
                f"{engine.prefill_token_s * 1e3:.3f} ms/token"
            )
        else:
            dirs.append(a)
    if source:  # after the loop: --cores may come later on the command line
        decode_from = fit.load_run(source, cores)
    print(
        f"{'run':<44} {'mode':<6} {'eta':>3} {'fit':<5} {'measured':>9} {'predicted':>9} {'error':>7} "
        f"{'trainer idle m/p':>16} {'engine idle m/p':>15}"
    )
    errs: dict[str, list[float]] = {}
    for d in dirs:
        run = fit.load_run(d, cores)
        m = fit.measured(run)
        st = fit.setup(run, alpha, decode_alpha)
        for how in ("self", "cross", "bench", "scaled"):
            if how == "cross" and (decode_from is None or decode_from.path == run.path):
                continue
            if how in ("bench", "scaled") and engine is None:
                continue
            src = decode_from if how == "cross" else None
            eng = engine if how in ("bench", "scaled") else None
            costs, _ = fit.fit_costs(run, alpha, src, decode_alpha, shared, eng, how == "scaled")
            r = simulate(costs, fit.workload(run, shared or eng is not None), st)
            err = r.samples_per_s / m["samples_per_s"] - 1
            errs.setdefault(how, []).append(abs(err))
            print(
                f"{d[-44:]:<44} {st.mode:<6} {st.eta:>3} {how:<5} {m['samples_per_s']:>9.3f} "
                f"{r.samples_per_s:>9.3f} {err:>+7.1%} {m['trainer_idle']:>7.2f}/{r.trainer_idle:<8.2f} "
                f"{m['engine_idle']:>7.2f}/{r.engine_idle:<7.2f}"
            )
    for how, e in errs.items():
        print(f"{how}: mean |error| {sum(e) / len(e):.1%}, max {max(e):.1%} over {len(e)} runs")


if __name__ == "__main__":
    main(sys.argv[1:])
