"""The engine's LM head (models/frozen.py: engine_head): on one CPU thread in fp32, without gradients, a
product of 7 to 15 rows runs padded to 16 (MKL's slow path there, benchmarks/head_rows.py), and each
row's logits are those of the unpadded product."""

from __future__ import annotations

import pytest
import torch

from streamrl.models.frozen import PAD_ROWS, engine_head, freeze


class HeadOnly(torch.nn.Module):
    """A model that is only an LM head, whose forward records the row count of every input."""

    def __init__(self) -> None:
        super().__init__()
        self.head = torch.nn.Linear(8, 50, bias=False)
        self.seen: list[tuple[int, ...]] = []
        own = self.head.forward

        def spy(x: torch.Tensor) -> torch.Tensor:
            self.seen.append(tuple(x.shape))
            return own(x)

        self.head.forward = spy

    def get_output_embeddings(self) -> torch.nn.Linear:
        return self.head


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_seven_to_fifteen_rows_run_as_sixteen_and_keep_their_own_logits(one_thread):
    assert PAD_ROWS == (7, 16)
    model = freeze(HeadOnly())
    weight = model.head.weight
    for shape in [(10, 1, 8), (7, 8), (3, 5, 8), (15, 1, 8)]:
        x = torch.randn(shape)
        model.seen.clear()
        with torch.no_grad():
            out = model.get_output_embeddings()(x)
        assert model.seen == [(16, 8)], shape
        assert out.shape == (*shape[:-1], 50)
        assert torch.allclose(out, x @ weight.T, atol=1e-6)
    x = torch.randn(9, 8)
    model.seen.clear()
    with torch.no_grad():
        out = model.get_output_embeddings()(input=x)  # nn.Linear's keyword
    assert model.seen == [(16, 8)] and torch.allclose(out, x @ weight.T, atol=1e-6)


def test_other_row_counts_threads_and_gradients_run_as_they_are(one_thread):
    model = freeze(HeadOnly())
    head = model.get_output_embeddings()
    with torch.no_grad():
        for rows in (1, 6, 16, 40):
            model.seen.clear()
            head(torch.randn(rows, 1, 8))
            assert model.seen == [(rows, 1, 8)]
        torch.set_num_threads(2)  # the unpadded product is the faster on two threads
        model.seen.clear()
        head(torch.randn(10, 8))
        assert model.seen == [(10, 8)]
        torch.set_num_threads(1)
        model.seen.clear()
        head(torch.randn(10, 8))  # back on one thread: padded
        assert model.seen == [(16, 8)]
        model.seen.clear()
        head.double()(torch.randn(10, 8, dtype=torch.float64))  # another dtype: as it is
        assert model.seen == [(10, 8)]
    head.float()
    model.seen.clear()
    with torch.enable_grad():
        head(torch.randn(10, 8, requires_grad=True))  # a product under autograd (the trainer's): as it is
    assert model.seen == [(10, 8)]


def test_the_padding_is_installed_once(one_thread):
    model = HeadOnly()
    engine_head(model)
    engine_head(model)
    freeze(model)
    with torch.no_grad():
        model.get_output_embeddings()(torch.randn(9, 8))
    assert model.seen == [(16, 8)]  # one padded product, not a padded product of a padded product
