import copy

import pytest
import torch

from streamrl.loop.ledger import Ledger
from streamrl.placement.shared_weights import SharedWeights


def test_ledger_exactly_once_transitions():
    led = Ledger()
    for g in ("a", "b", "c", "d"):
        led.admitted(g)
    led.returned("a")
    led.trained("a")
    led.returned("b")
    led.filtered("b", "stale")
    led.returned("c")
    with pytest.raises(RuntimeError, match="group a: cannot go from 'trained' to 'trained'"):
        led.trained("a")
    with pytest.raises(RuntimeError, match="cannot go from 'running'"):
        led.trained("d")  # never returned
    assert sorted(led.carry_over()) == ["c", "d"]
    c = led.counts()
    assert (c["trained"], c["filtered"], c["carried_over"], c["lost"], c["generated"]) == (1, 1, 2, 0, 3)
    assert c["filter_reasons"] == {"stale": 1}
    resumed = Ledger()
    resumed.load_state_dict(led.state_dict())
    resumed.requeue("c", "buffered")
    resumed.requeue("d", "running")
    resumed.trained("c")
    resumed.returned("d")
    resumed.trained("d")
    assert resumed.counts()["trained"] == 3 and resumed.counts()["lost"] == 0


def test_ledger_counts_unaccounted_groups_as_lost():
    led = Ledger()
    led.admitted("x")
    assert led.counts()["lost"] == 1  # neither trained, filtered nor carried over


def test_shared_weights_roundtrip(tiny):
    model = copy.deepcopy(tiny[0])
    other = copy.deepcopy(model)
    sw = SharedWeights(model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    sw.publish(model, version=3)
    assert sw.version == 3
    assert sw.load_into(other) == 3
    for a, b in zip(model.state_dict().values(), other.state_dict().values()):
        assert torch.equal(a, b)


def test_shared_weights_reader_waits_for_a_complete_write(tiny):
    sw = SharedWeights(copy.deepcopy(tiny[0]))
    sw.begin.value = 9  # a writer that started and never finished
    with pytest.raises(TimeoutError, match="weights never settled"):
        sw.load_into(copy.deepcopy(tiny[0]), timeout=0.05)


def test_publish_marks_the_copy_in_progress_until_it_is_complete(tiny):
    """During a publish, readers see `begin` ahead of `end` (a torn copy) and the old version."""
    sw = SharedWeights(copy.deepcopy(tiny[0]))
    seen: list[tuple[int, int]] = []

    class Watched(dict):
        def __getitem__(self, name):
            seen.append((int(sw.begin.value), sw.version))
            return super().__getitem__(name)

    sw.publish(Watched(tiny[0].state_dict()), version=3)
    assert seen and all(pair == (3, 0) for pair in seen)  # mid-copy: begun 3, complete still 0
    assert (sw.begin.value, sw.version) == (3, 3)
