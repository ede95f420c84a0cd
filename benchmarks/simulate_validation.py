"""Predicted vs measured samples/s of real runs (the simulator against metrics.jsonl).

    python benchmarks/simulate_validation.py RUN_DIR [RUN_DIR ...] [--decode-from RUN_DIR] [--cores N]
                                             [--alphas ALPHAS.json]

self: costs fitted on the run itself (in-sample: only the schedule - overlap, staleness admission,
thread split - is predicted). cross (with --decode-from, e.g. a colocated sync run): decode costs come
from that other run, so async runs are predicted from a synchronous one's generation speed.
--alphas: the thread-scaling exponents measured by benchmarks/thread_scaling.py (decode_thread_scaling,
thread_scaling; default 1 for both), which carry a cost fitted at one thread count to another (a
colocated run's 2-thread decoding to an async worker's 1 thread).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from streamrl.sim import fit
from streamrl.sim.model import simulate


def main(argv: list[str]) -> None:
    dirs, decode_from, cores = [], None, 2
    alpha, decode_alpha = 1.0, None
    it = iter(argv)
    for a in it:
        if a == "--decode-from":
            decode_from = fit.load_run(next(it), cores)
        elif a == "--cores":
            cores = int(next(it))
        elif a == "--alphas":
            measured_alphas = json.loads(Path(next(it)).read_text())
            alpha, decode_alpha = measured_alphas["thread_scaling"], measured_alphas["decode_thread_scaling"]
            print(f"thread scaling: train alpha {alpha:.2f}, decode alpha {decode_alpha:.2f}")
        else:
            dirs.append(a)
    print(f"{'run':<44} {'mode':<6} {'eta':>3} {'fit':<5} {'measured':>9} {'predicted':>9} {'error':>7} "
          f"{'trainer idle m/p':>16} {'engine idle m/p':>15}")
    errs: list[float] = []
    for d in dirs:
        run = fit.load_run(d, cores)
        m = fit.measured(run)
        st = fit.setup(run, alpha, decode_alpha)
        for how, src in (("self", None), ("cross", decode_from)):
            if how == "cross" and (src is None or src.path == run.path):
                continue
            costs, _ = fit.fit_costs(run, alpha, src, decode_alpha)
            r = simulate(costs, fit.workload(run), st)
            err = r.samples_per_s / m["samples_per_s"] - 1
            errs.append(abs(err))
            print(f"{d[-44:]:<44} {st.mode:<6} {st.eta:>3} {how:<5} {m['samples_per_s']:>9.3f} "
                  f"{r.samples_per_s:>9.3f} {err:>+7.1%} {m['trainer_idle']:>7.2f}/{r.trainer_idle:<8.2f} "
                  f"{m['engine_idle']:>7.2f}/{r.engine_idle:<7.2f}")
    if errs:
        print(f"mean |error| {sum(errs) / len(errs):.1%} over {len(errs)} predictions")


if __name__ == "__main__":
    main(sys.argv[1:])
