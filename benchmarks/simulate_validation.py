"""Predicted vs measured samples/s of real runs (the simulator against metrics.jsonl).

    python benchmarks/simulate_validation.py RUN_DIR [RUN_DIR ...] [--decode-from RUN_DIR] [--cores N]

self: costs fitted on the run itself (in-sample: only the schedule - overlap, staleness admission,
thread split - is predicted). cross (with --decode-from, e.g. a colocated sync run): decode costs come
from that other run, so async runs are predicted from a synchronous one's generation speed.
"""

from __future__ import annotations

import sys

from streamrl.sim import fit
from streamrl.sim.model import simulate


def main(argv: list[str]) -> None:
    dirs, decode_from, cores = [], None, 2
    it = iter(argv)
    for a in it:
        if a == "--decode-from":
            decode_from = fit.load_run(next(it), cores)
        elif a == "--cores":
            cores = int(next(it))
        else:
            dirs.append(a)
    print(f"{'run':<44} {'mode':<6} {'eta':>3} {'fit':<5} {'measured':>9} {'predicted':>9} {'error':>7} "
          f"{'trainer idle m/p':>16} {'engine idle m/p':>15}")
    errs: list[float] = []
    for d in dirs:
        run = fit.load_run(d, cores)
        m = fit.measured(run)
        st = fit.setup(run)
        for how, src in (("self", None), ("cross", decode_from)):
            if how == "cross" and (src is None or src.path == run.path):
                continue
            costs, _ = fit.fit_costs(run, decode_from=src)
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
