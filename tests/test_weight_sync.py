"""Weight sync's pieces without Ray: the flat layout moves every dtype's tensors and only them, the
receiver keeps the newest announcement, and the copy reaches the model."""

from __future__ import annotations

import torch

from streamrl.placement.weight_sync import FlatLayout, ObjectStoreReceiver, copy_into


def _mixed() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "a": torch.randn(2, 3, generator=g),
        "b": torch.randn(4, generator=g).to(torch.bfloat16),
        "c": torch.randn(3, 1, generator=g),
        "d": torch.arange(5),
    }


def test_a_mixed_dtype_state_round_trips_through_one_flat_buffer_per_dtype() -> None:
    state = _mixed()
    layout = FlatLayout.of(state)
    flats = layout.flatten(state)
    assert {d: tuple(t.shape) for d, t in flats.items()} == {"bfloat16": (4,), "float32": (9,), "int64": (5,)}
    assert torch.equal(flats["float32"], torch.cat([state["a"].reshape(-1), state["c"].reshape(-1)]))
    back = layout.unflatten(flats)
    assert list(back) == list(state)
    for name, t in state.items():
        assert back[name].dtype == t.dtype and torch.equal(back[name], t), name
    received = layout.empty()  # what a receiver allocates and fills in place
    for d, t in flats.items():
        received[d].copy_(t)
    assert all(torch.equal(layout.unflatten(received)[n], t) for n, t in state.items())


def test_a_late_older_announcement_does_not_replace_a_newer_one() -> None:
    receiver = ObjectStoreReceiver(timeout=1.0)
    receiver.announce(5, ["v5"])
    receiver.announce(3, ["v3"])  # overtaken on the way
    assert receiver.version == 5
    receiver.announce(6, ["v6"])
    assert receiver.version == 6


def test_copy_into_writes_every_named_tensor_into_the_model() -> None:
    model = torch.nn.Linear(3, 2)
    new = {"weight": torch.full((2, 3), 0.5), "bias": torch.tensor([1.0, -1.0])}
    copy_into(model, new)
    assert torch.equal(model.weight, new["weight"]) and torch.equal(model.bias, new["bias"])
