"""A sampler's state as of a mark (the start of a step that may fail): exact, and resumed to the draws
of a run without the failed step. (That the colocated loop's marks copy no posteriors is checked
in test_step_failure.py.)"""

import copy
import json
import random

import pytest
from test_samplers import _epochs, _group, _population

from streamrl.data import mopps, samplers
from streamrl.data.bounded_memory import BoundedMemory
from streamrl.data.samplers import MoPPSSampler, OnlineFilterSampler, Sampler


def test_the_memory_as_of_a_mark_is_its_contents_then_in_order():
    """Puts of new and known keys, forgetting past the limit and pops after a mark: the entries as of
    the mark come back exactly, least recent first; a later mark starts again from there."""
    rng = random.Random(0)
    memory: BoundedMemory[int] = BoundedMemory(5, [("a", 1), ("b", 2)])
    for round_ in range(30):
        memory.mark()
        then = list(memory.items())
        for k in range(rng.randrange(0, 9)):
            key = f"k{rng.randrange(8)}"
            if key in memory and rng.random() < 0.2:
                memory.pop(key)
            else:
                memory.put(key, 100 * round_ + k)
            assert len(memory) <= 5
        assert memory.items_at_mark() == then
    assert list(BoundedMemory(5, [("a", 1)]).items_at_mark()) == [("a", 1)]  # never marked: as now


def test_a_memory_forgets_the_least_recently_set_entry():
    memory: BoundedMemory[int] = BoundedMemory(2)
    memory.put("a", 1)
    memory.put("b", 2)
    memory.put("a", 3)  # now the most recent
    memory.put("c", 4)
    assert list(memory.items()) == [("a", 3), ("c", 4)] and memory.get("b") is None


def _feedback(sampler, draws: int, rng: random.Random) -> list[str]:
    seen = []
    for _ in range(draws):
        p = next(sampler)
        seen.append(p.id)
        sampler.observe(_group(p, rng))
    return seen


@pytest.mark.parametrize("memory", [6, samplers.MEMORY])
def test_mopps_resumed_from_a_mark_draws_what_a_run_without_the_failed_step_draws(monkeypatch, memory):
    """Draws and feedback after the mark (a step that then fails) change the pool, the posteriors (some
    forgotten past a small memory) and the RNG: the state as of the mark is the one saved there, and a
    sampler resumed from it draws what the run that went on from the mark draws."""
    monkeypatch.setattr(mopps, "MEMORY", memory)
    run, whole = (MoPPSSampler(_epochs(_population()), pool=8, seed=3) for _ in range(2))
    _feedback(run, 40, random.Random(0))
    _feedback(whole, 40, random.Random(0))
    run.mark()
    saved = json.loads(json.dumps(run.state_dict()))
    _feedback(run, 12, random.Random(1))  # the failed step
    assert run.state_at_mark() == saved != run.state_dict()
    resumed = MoPPSSampler(_epochs(_population()), pool=8, seed=99)
    resumed.load_state_dict(json.loads(json.dumps(run.state_at_mark())))
    assert _feedback(resumed, 30, random.Random(2)) == _feedback(whole, 30, random.Random(2))
    assert resumed.state_dict() == whole.state_dict()


@pytest.mark.parametrize("make", [Sampler, OnlineFilterSampler])
def test_other_samplers_state_as_of_a_mark_is_the_one_saved_there(make):
    s = make(_epochs(_population()))
    _feedback(s, 30, random.Random(0))
    s.mark()
    saved = json.loads(json.dumps(s.state_dict()))
    _feedback(s, 10, random.Random(1))
    assert json.loads(json.dumps(s.state_at_mark())) == saved != s.state_dict()


@pytest.mark.parametrize("memory", [20, samplers.MEMORY])
def test_online_filter_marks_copy_nothing_and_rebuild_the_state_of_the_mark(monkeypatch, memory):
    """A mark takes no state (the pass rates it remembers are not copied at every step). After draws and
    feedback since (rates of prompts seen before the mark set again, new prompts', skip counts raised
    and cleared at a recheck, rates forgotten past a small memory), the state as of the mark is the one
    a deep copy took then."""
    monkeypatch.setattr(samplers, "MEMORY", memory)
    s = OnlineFilterSampler(_epochs(_population()), recheck=3)
    _feedback(s, 100, random.Random(0))
    then = copy.deepcopy(s.state_dict())
    before = {k for k, _ in then["rate"]}
    real, taken = OnlineFilterSampler.state_dict, []
    monkeypatch.setattr(OnlineFilterSampler, "state_dict", lambda self: taken.append(1) or real(self))
    s.mark()
    assert taken == []  # nothing taken at the mark
    after = set(_feedback(s, 100, random.Random(1)))
    assert after & before and after - before  # rates the mark held set again, and new ones
    now = real(s)
    assert now["rate"] != then["rate"] and now["skips"] != then["skips"] and now["counts"] != then["counts"]
    assert then["skips"] and s.state_at_mark() == then
