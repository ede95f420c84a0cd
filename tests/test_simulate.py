"""The pipeline simulator: hand-computed timelines, the staleness bound, partial-rollout accounting,
shared cores and their lending, the settings it refuses."""

from __future__ import annotations

import random
import re
import statistics
from dataclasses import replace

import pytest

from streamrl.sim import fit
from streamrl.sim.lengths import Cycle, Fixed, LogNormal, StepStats
from streamrl.sim.model import simulate
from streamrl.sim.params import Costs, Setup, Workload

# one decode step = 1 s whatever the batch, a sample of 2 tokens trains in 3 s
UNIT = Costs(decode_step_s=1.0, decode_token_s=0.0, train_token_s=1.5)
TINY = Workload(Fixed(2), batch_groups=1, group_size=1, prompt_len=0)


def test_sync_timeline_by_hand() -> None:
    # generate 0-2, train 2-5; generate 5-7, train 7-10; generate 10-12, train 12-15
    r = simulate(UNIT, TINY, Setup(mode="sync", steps=3), trace=True)
    assert r.time == pytest.approx(15.0)
    trains = [t for t, what in r.trace if what.startswith("train")]
    assert trains == [2.0, 7.0, 12.0]
    assert r.staleness_hist == {0: 6}
    assert r.trainer_idle == pytest.approx(6 / 15) and r.engine_idle == pytest.approx(9 / 15)


def test_async_eta1_timeline_by_hand() -> None:
    # v0 admits g0 only (the lead ramps up: the base policy generates one batch): done at 2, train g0
    # 2-5 -> v1 admits g1, g2 (bound 3): both done at 7. train g1 7-10 -> v2 admits g3 (bound 4), which
    # generates 10-12 while g2 trains 10-13 (v1 tokens at v2: staleness 1)
    r = simulate(UNIT, TINY, Setup(mode="async", eta=1, steps=3), trace=True)
    assert r.time == pytest.approx(13.0)
    assert [(t, w) for t, w in r.trace if w.startswith(("admit", "train"))] == [
        (0.0, "admit g0 e0 v0"),
        (2.0, "train v0 [g0]"),
        (5.0, "admit g1 e0 v1"),
        (5.0, "admit g2 e0 v1"),
        (7.0, "train v1 [g1]"),
        (10.0, "admit g3 e0 v2"),
        (10.0, "train v2 [g2]"),
    ]
    assert r.staleness_hist == {0: 4, 1: 2}
    assert r.groups_in_flight == 1  # g3 finished, never trained: carried


def test_async_eta0_equals_sync_on_the_same_resources() -> None:
    work = Workload(Cycle((3, 1, 7, 2, 5)), batch_groups=2, group_size=3, prompt_len=4)
    costs = Costs(
        decode_step_s=0.3, decode_token_s=0.05, prefill_token_s=0.01, train_token_s=0.02, weight_sync_s=0.1
    )
    a = simulate(costs, work, Setup(mode="async", eta=0, engines=2, steps=4))
    s = simulate(costs, work, Setup(mode="sync", engines=2, steps=4))
    assert a.time == pytest.approx(s.time)
    assert a.staleness_hist == s.staleness_hist and list(s.staleness_hist) == [0]


def test_decode_cost_and_interrupt_recompute_by_hand() -> None:
    # 1 group of 2 samples (lengths 1 and 3), prompt 2: step 1 = prefill 2*2*0.5 + 1 + 2*0.25 = 3.5,
    # steps 2-3 = 1 + 0.25 = 1.25 each -> group done at 6.0, train 1 s (tokens 3+5, 0.125/token)
    costs = Costs(decode_step_s=1.0, decode_token_s=0.25, prefill_token_s=0.5, train_token_s=0.125)
    work = Workload(Cycle((1, 3)), batch_groups=1, group_size=2, prompt_len=2)
    r = simulate(costs, work, Setup(mode="sync", steps=1), trace=True)
    assert r.time == pytest.approx(7.0)
    # async eta=1: g0 alone as above (done at 6, train 6-7); v1 admits g1 and g2 (lengths 1, 3 each),
    # which start together: step 1 = 4 * 2 * 0.5 + 1 + 4 * 0.25 = 6, steps 2-3 = 1.5 each -> both done
    # at 16; train g1 16-17 (no group runs when v1 arrives: no recompute)
    r2 = simulate(costs, work, Setup(mode="async", eta=1, steps=2, weight_update="interrupt"), trace=True)
    assert [t for t, w in r2.trace if w.startswith("done")] == [6.0, 16.0, 16.0]
    assert r2.time == pytest.approx(17.0)


def test_shared_decode_rows_cost_per_cache_row_by_hand() -> None:
    # the case above with half a cache row per sequence: step 1 = 2 * 2 * 0.5 + 1 + 2 * 0.25 * 0.5 =
    # 3.25, steps 2-3 (one sequence) = 1 + 0.25 * 0.5 = 1.125 each -> group done at 5.5, train 1 s
    costs = Costs(decode_step_s=1.0, decode_token_s=0.25, prefill_token_s=0.5, train_token_s=0.125)
    work = Workload(Cycle((1, 3)), batch_groups=1, group_size=2, prompt_len=2, row_share=0.5)
    assert simulate(costs, work, Setup(mode="sync", steps=1)).time == pytest.approx(6.5)
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match=rf"row_share must be in \(0, 1\] .*got {bad}"):
            simulate(costs, replace(work, row_share=bad), Setup(mode="sync", steps=1))


def test_step_lengths_have_the_logged_mean_truncation_and_spread() -> None:
    # no spread: every sample is the mean, and a round of one group of 4 is 8 decode steps (8 s) and
    # trains 4 x 8 tokens (48 s); an exponential of mean 8 would run to its longest of 4 samples
    still = StepStats((8.0,), (0.0,), 48, stds=(0.0,))
    rng = random.Random(0)
    assert {still.sample(0, rng) for _ in range(100)} == {8}
    work = Workload(still, batch_groups=1, group_size=4, prompt_len=0)
    assert simulate(UNIT, work, Setup(mode="sync", steps=1)).time == pytest.approx(56.0)
    # m = 10, tr = 0.1, L = 40: untruncated mean (10 - 4) / 0.9 = 6.67; with their std at 2 the logged
    # std is sqrt(0.9 (4 + 6.67^2) + 0.1 x 40^2 - 10^2) = 10.18
    body = 6 / 0.9
    s = (0.9 * (4 + body**2) + 0.1 * 1600 - 100) ** 0.5
    stats = StepStats((10.0,), (0.1,), 40, stds=(s,))
    draws = [stats.sample(0, rng) for _ in range(40000)]
    untruncated = [x for x in draws if x < 40]
    assert len(draws) - len(untruncated) == pytest.approx(0.1 * len(draws), rel=0.05)
    assert statistics.fmean(untruncated) == pytest.approx(body, rel=0.02)
    assert statistics.pstdev(untruncated) == pytest.approx(2.0, rel=0.05)
    assert statistics.fmean(draws) == pytest.approx(10.0, rel=0.02)
    # without a logged spread: exponential (the untruncated std equals their mean)
    old = StepStats((10.0,), (0.1,), 40)
    plain = [x for x in (old.sample(0, rng) for _ in range(40000)) if x < 40]
    assert statistics.pstdev(plain) == pytest.approx(statistics.fmean(plain), rel=0.1)


def test_interrupt_costs_a_recompute_inflight_does_not() -> None:
    work = Workload(Cycle((1, 9)), batch_groups=1, group_size=1, prompt_len=4)
    costs = Costs(
        decode_step_s=1.0, decode_token_s=0.0, prefill_token_s=0.25, train_token_s=0.0, train_step_s=0.5
    )
    inflight = simulate(costs, work, Setup(mode="async", eta=1, steps=3, weight_update="inflight"))
    interrupt = simulate(costs, work, Setup(mode="async", eta=1, steps=3, weight_update="interrupt"))
    # v0 admits g0 alone (1 token): prefill 4 * 0.25 + 1, done at 2, train 2-2.5 -> v1 admits g1 (9
    # tokens) and g2 (1). Step 2.5-5.5 = prefill 2 * 4 * 0.25 + 1: g2 done, g1 has 1; train g2 5.5-6 -> v2
    # admits g3 (9); step 5.5-6.5 started under v1; step at 6.5: g3 joins (prefill 1) + 1 and, with
    # interrupt, g1 recomputes prompt 4 + 2 tokens at 0.25 = 1.5 -> 8.5 (inflight) or 10, g1 has 3
    # tokens. g1, admitted under v1, is on its last version at v2: the batch waits for it rather than
    # take g3 (6 more steps: done at 14.5 or 16, nothing else admitted meanwhile); train 0.5
    assert inflight.time == pytest.approx(15.0)
    assert interrupt.time == pytest.approx(16.5)
    assert inflight.filtered_stale == interrupt.filtered_stale == 0


@pytest.mark.parametrize("eta", [0, 1, 2, 3])
@pytest.mark.parametrize("update", ["inflight", "interrupt"])
def test_staleness_bound_never_exceeded(eta: int, update: str) -> None:
    work = Workload(
        LogNormal(20, 1.2, 400), batch_groups=3, group_size=2, prompt_len=5, max_batch=4, filter_rate=0.2
    )
    costs = Costs(decode_step_s=0.01, decode_token_s=0.002, prefill_token_s=0.001, train_token_s=0.004)
    for engines in (1, 3):
        r = simulate(
            costs,
            work,
            Setup(mode="async", eta=eta, engines=engines, steps=15, seed=eta, weight_update=update),
        )
        assert r.staleness_max <= eta
        assert r.groups_trained == 15 * 3
        if eta <= 1:  # a batch waits for the groups on their last version: none is generated in vain
            assert r.filtered_stale == 0
        accounted = r.groups_trained + r.filtered_stale + r.filtered_other + r.groups_in_flight
        assert r.groups_admitted == accounted


@pytest.mark.parametrize("over", [1.0, 1.5, 2.0, 3.0])
def test_partial_rollouts_never_lose_or_duplicate(over: float) -> None:
    work = Workload(LogNormal(10, 1.5, 200), batch_groups=4, group_size=2, prompt_len=3, filter_rate=0.1)
    r = simulate(
        Costs(decode_step_s=0.1, decode_token_s=0.01),
        work,
        Setup(mode="partial", overprovision=over, engines=2, steps=12),
        trace=True,
    )
    trained = [g for _, w in r.trace if w.startswith("train") for g in re.findall(r"g\d+", w)]
    admitted = [w.split()[1] for _, w in r.trace if w.startswith("admit")]
    filtered = [w.split()[1] for _, w in r.trace if w.startswith("filtered")]
    assert len(trained) == len(set(trained)) == 12 * 4
    assert not set(trained) & set(filtered)
    assert len(admitted) == len(set(admitted)) == len(trained) + len(filtered) + r.groups_in_flight
    assert r.groups_in_flight <= len(admitted)


def test_partial_beats_sync_under_long_tail_and_carries_over() -> None:
    work = Workload(LogNormal(50, 1.0, 2000), batch_groups=8, group_size=4, prompt_len=10, max_batch=64)
    costs = Costs(decode_step_s=0.02, decode_token_s=1e-4, train_token_s=1e-4)
    sync = simulate(costs, work, Setup(mode="sync", steps=10, chunk=4))
    part = simulate(costs, work, Setup(mode="partial", steps=10, chunk=4, overprovision=2.0))
    assert part.samples_per_s > sync.samples_per_s and part.staleness_max >= 1


def test_shared_prefill_charges_a_groups_prompt_once() -> None:
    # 1 group of 3 samples of 2 tokens, prompt 4 tokens at 0.5 s each, decode steps 1 s: the first step
    # costs 1 + 3 * 4 * 0.5 = 7 s per sample prefill, 1 + 4 * 0.5 = 3 s shared; then 1 s; train 0
    costs = Costs(decode_step_s=1.0, decode_token_s=0.0, prefill_token_s=0.5, train_token_s=0.0)
    work = Workload(Fixed(2), batch_groups=1, group_size=3, prompt_len=4)
    each = simulate(costs, work, Setup(mode="sync", steps=1))
    shared = simulate(costs, replace(work, shared_prefill=True), Setup(mode="sync", steps=1))
    assert each.time == pytest.approx(8.0) and shared.time == pytest.approx(4.0)


def test_cached_prefix_is_prefilled_once_per_engine_and_version() -> None:
    # 2 groups of 3 samples of 2 tokens, prompt 4 tokens at 0.5 s each, shared prefill, decode steps 1 s.
    # A round's first step: 1 + 2 groups x 4 x 0.5 = 5 s without the prefix cache; with a 3-token cached
    # prefix 1 + 2 x 1 x 0.5 + 3 x 0.5 (the prefix, once under this version) = 3.5 s; then 1 s.
    # Two rounds, the second under new weights: 12 s against 9 s (7.5 s if the prefix were not recomputed)
    costs = Costs(decode_step_s=1.0, decode_token_s=0.0, prefill_token_s=0.5, train_token_s=0.0)
    work = Workload(Fixed(2), batch_groups=2, group_size=3, prompt_len=4, shared_prefill=True)
    plain = simulate(costs, work, Setup(mode="sync", steps=2))
    cached = simulate(costs, replace(work, cached_prefix=3), Setup(mode="sync", steps=2))
    assert plain.time == pytest.approx(12.0) and cached.time == pytest.approx(9.0)
    # one group at a time (max_batch 3): the second group joins 2 steps later under the same weights and
    # prefills only its own token: 3 + 1 + 1.5 + 1 per round, 13 s (16 s if the prefix were charged again)
    one = simulate(costs, replace(work, cached_prefix=3, max_batch=3), Setup(mode="sync", steps=2))
    assert one.time == pytest.approx(13.0)
    with pytest.raises(ValueError, match=r"cached_prefix must be 0 or below prompt_len \(4\)"):
        simulate(costs, replace(work, cached_prefix=4), Setup(mode="sync", steps=1))


def test_shared_cores_split_and_contention() -> None:
    # colocated sync on 2 shared cores, alpha = 1: every phase twice as fast as on 1 core
    one = simulate(UNIT, TINY, Setup(mode="sync", steps=3, shared_cores=1))
    two = simulate(
        UNIT, TINY, Setup(mode="sync", steps=3, shared_cores=2, engine_threads=2, trainer_threads=2)
    )
    assert one.time == pytest.approx(15.0) and two.time == pytest.approx(7.5)
    # decoding that does not scale with threads (decode alpha 0): generation 2 s per step as on one
    # core, training 3 / 2 ** 0.5 s (train alpha 0.5); 3 steps
    mixed = simulate(
        UNIT,
        TINY,
        Setup(
            mode="sync",
            steps=3,
            shared_cores=2,
            engine_threads=2,
            trainer_threads=2,
            thread_scaling=0.5,
            decode_thread_scaling=0.0,
        ),
    )
    assert mixed.time == pytest.approx(3 * (2.0 + 3.0 / 2**0.5))
    # async on 2 cores split 1 + 1 overlaps without loss; contention 0.5 slows the overlap by 1.5x:
    # 0-2 generate g0, 2-5 train g0, 5-7 generate g1 and g2, 7-10 train g1: no overlap while the lead
    # ramps up; then g3 (10-12) overlaps train g2 (10-13)
    base = Setup(mode="async", eta=1, steps=3, shared_cores=2)
    assert simulate(UNIT, TINY, base).time == pytest.approx(13.0)
    slow = simulate(UNIT, TINY, replace(base, contention=0.5))
    # 10-13: both at 1/1.5 -> g3's 2 s of work done at 13; the trainer did 2 of 3 s, the last 1 s alone
    assert slow.time == pytest.approx(14.0)


def test_elastic_cores_lend_a_waiting_phases_threads_by_hand() -> None:
    # async eta 1 on 2 cores split 1 + 1, alpha 1: 0-1 g0 decodes on both cores (the trainer waits);
    # 1-2.5 train g0 on both (the engine waits at the bound); 2.5-3.5 g1, g2 on both; 3.5-5 train g1 on
    # both; v2 admits g3: 5-7 g3 and train g2 on one core each; g2's last 1 s of work on both cores:
    # done at 7.5 (a fixed split: 13.0)
    base = Setup(mode="async", eta=1, steps=3, shared_cores=2)
    r = simulate(UNIT, TINY, replace(base, elastic=True), trace=True)
    assert r.time == pytest.approx(7.5)
    trains = [t for t, w in r.trace if w.startswith("train")]
    assert trains == [pytest.approx(1.0), pytest.approx(3.5), pytest.approx(5.0)]
    assert simulate(UNIT, TINY, base).time == pytest.approx(13.0)
    assert fit.setup(fit.Run(None, {"runtime": {"elastic_cores": True}}, [{}], 2)).elastic is True


@pytest.mark.parametrize(
    ("setup", "work", "message"),
    [
        (Setup(mode="batch"), TINY, "mode must be one of sync, async, partial, got 'batch'"),
        (Setup(weight_update="reload"), TINY, "weight_update must be inflight|interrupt, got 'reload'"),
        (Setup(eta=-1), TINY, "eta must be >= 0, got -1"),
        (Setup(mode="partial", overprovision=0.5), TINY, "overprovision must be >= 1, got 0.5"),
        (Setup(chunk=0), TINY, "chunk must be >= 1, got 0"),
        (Setup(), replace(TINY, filter_rate=1.0), "filter_rate must be in [0, 1), got 1.0"),
    ],
)
def test_impossible_settings_are_refused_with_their_line(setup: Setup, work: Workload, message: str) -> None:
    with pytest.raises(ValueError) as e:
        simulate(UNIT, work, setup)
    assert str(e.value) == message


def test_mean_staleness_weighs_each_level_by_its_samples() -> None:
    r = simulate(UNIT, TINY, Setup(mode="sync", steps=1))
    r.staleness_hist = {1: 3, 2: 1}
    assert (r.staleness_mean, r.staleness_max) == (1.25, 2)
