"""The engine's Linear layers other than the LM head (models/frozen.py: engine_body): on a CPU in fp32,
without gradients, a product of 8 to 15 rows by a weight of 2^18 values or more runs as weight @ rows^T
(MKL's faster path there, benchmarks/body_rows.py), and each row's output is that of the usual product."""

from __future__ import annotations

import pytest
import torch

from streamrl.engine.base import GenRequest
from streamrl.engine.hf import HFEngine
from streamrl.models import frozen
from streamrl.models.frozen import FEW_ROWS, FEW_ROWS_WEIGHT, TUNING, engine_body, freeze


class Body(torch.nn.Module):
    """Two Linear layers of 2^18 values, one with a bias, a smaller one, and an LM head."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.up = torch.nn.Linear(512, 512, bias=False)
        self.down = torch.nn.Linear(512, 512, bias=True)
        self.small = torch.nn.Linear(512, 511, bias=False)
        self.head = torch.nn.Linear(512, 50, bias=False)

    def get_output_embeddings(self) -> torch.nn.Linear:
        return self.head


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """Every torch.mm / torch.addmm / F.linear call, by name and operand shapes."""
    seen: list[tuple] = []
    for owner, name in ((torch, "mm"), (torch, "addmm"), (torch.nn.functional, "linear")):
        own = getattr(owner, name)

        def spy(*args, _own=own, _name=name, **kwargs):
            seen.append((_name, *(tuple(a.shape) for a in args if isinstance(a, torch.Tensor))))
            return _own(*args, **kwargs)

        monkeypatch.setattr(owner, name, spy)
    return seen


def test_eight_to_fifteen_rows_run_as_weight_times_their_transpose(calls):
    assert (FEW_ROWS, FEW_ROWS_WEIGHT) == ((8, 15), 512 * 512)
    model = freeze(Body())
    for shape in [(8, 512), (3, 4, 512), (15, 1, 512)]:
        x = torch.randn(shape)
        rows = x.numel() // 512
        calls.clear()
        with torch.no_grad():
            up = model.up(x)
            down = model.down(up)
        assert calls == [("mm", (512, 512), (512, rows)), ("addmm", (512, 1), (512, 512), (512, rows))]
        assert up.shape == shape and down.shape == shape
        assert up.is_contiguous() and down.is_contiguous()
        assert torch.allclose(up, x @ model.up.weight.T, atol=1e-5)
        assert torch.allclose(down, up @ model.down.weight.T + model.down.bias, atol=1e-5)


def test_other_row_counts_smaller_weights_dtypes_gradients_and_the_switch_run_the_usual_product(calls):
    model = freeze(Body())
    with torch.no_grad():
        for rows in (1, 7, 16, 48):
            calls.clear()
            model.up(torch.randn(rows, 1, 512))
            assert calls == [("linear", (rows, 1, 512), (512, 512))], rows
        calls.clear()
        model.up(torch.zeros(0, 512))  # no rows at all
        assert calls == [("linear", (0, 512), (512, 512))]
        calls.clear()
        model.small(torch.randn(10, 512))  # one row short of 2^18 values: the weight stays in cache
        assert calls == [("linear", (10, 512), (511, 512))]
        TUNING.transpose_body = False
        try:
            calls.clear()
            model.up(torch.randn(10, 512))
            assert calls == [("linear", (10, 512), (512, 512))]
        finally:
            TUNING.transpose_body = True
        model.up.double()
        calls.clear()
        model.up(torch.randn(10, 512, dtype=torch.float64))  # another dtype: as it is
        assert calls == [("linear", (10, 512), (512, 512))]
        model.up.float()
    calls.clear()
    with torch.enable_grad():
        model.up(torch.randn(10, 512, requires_grad=True))  # the trainer's forward: as it is
    assert calls == [("linear", (10, 512), (512, 512))]


def test_the_head_is_left_to_its_own_path_and_wrapping_again_changes_nothing(calls):
    model = Body()
    engine_body(model)
    engine_body(model)
    freeze(model)
    assert not hasattr(model.head, "_few_rows")
    calls.clear()
    with torch.no_grad():
        model.up(torch.randn(10, 512))
        model.head(torch.randn(20, 512))
    assert calls == [("mm", (512, 512), (512, 10)), ("linear", (20, 512), (50, 512))]


def test_an_engine_model_transposes_every_body_linear_and_generates_the_same(tiny, calls, monkeypatch):
    model, tok = tiny
    monkeypatch.setattr(frozen, "FEW_ROWS_WEIGHT", 0)  # the tiny model's weights are small
    prompts = [tok(f"{i} plus {i} is").input_ids for i in range(8)]  # decode steps of 8 rows
    runs, products = {}, {}
    for on in (False, True):
        TUNING.transpose_body = on
        try:
            calls.clear()
            engine = HFEngine(model, tok, max_batch=16, seed=3)
            runs[on] = engine.generate([GenRequest(p, 6, 1.0) for p in prompts])
            products[on] = sum(c[0] == "mm" for c in calls)
        finally:
            TUNING.transpose_body = True
    head = model.get_output_embeddings()
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear and m is not head]
    assert linears and all(getattr(m, "_few_rows", False) for m in linears)
    assert products[False] == 0 and products[True] >= len(linears)  # every layer at least once
    for a, b in zip(runs[False], runs[True], strict=True):
        assert a.token_ids == b.token_ids
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)
