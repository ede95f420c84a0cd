import torch
from transformers import DynamicCache

from streamrl.engine.kv_cache import growing_cache
from streamrl.models.cache_kwarg import cache_kwargs


def _decode(model, cache, ids, attn, steps, drop_at):
    """Greedy decode with `cache`; after step `drop_at` keep rows 0 and 2 only. Returns the logits [R, V]
    of every step."""
    out = []
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(
            input_ids=ids, attention_mask=attn, position_ids=pos, **cache_kwargs(model, cache)
        ).logits[:, -1]
        nxt = pos[:, -1:] + 1
        for step in range(steps):
            out.append(logits)
            tok = logits.argmax(-1, keepdim=True)
            if step == drop_at:
                keep = torch.tensor([0, 2])
                cache.batch_select_indices(keep)
                attn, nxt, tok = attn[keep], nxt[keep], tok[keep]
            attn = torch.cat([attn, torch.ones_like(tok)], dim=1)
            logits = model(
                input_ids=tok, attention_mask=attn, position_ids=nxt, **cache_kwargs(model, cache)
            ).logits[:, -1]
            nxt = nxt + 1
    return out


def test_growing_cache_decodes_exactly_like_dynamic_cache_across_growth_and_compaction(tiny):
    model, tok = tiny
    model = model.float().eval()
    rows = [tok(s).input_ids for s in ["hi", "a longer prompt here", "1+1="]]
    width = max(map(len, rows))
    ids = torch.tensor([[tok.pad_token_id] * (width - len(r)) + r for r in rows])
    attn = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    # initial room of 2 columns past the prompt: the buffer doubles several times in 12 steps
    cache = growing_cache(initial=width + 2, limit=width + 12)
    ref = _decode(model, DynamicCache(), ids, attn, 12, drop_at=4)
    got = _decode(model, cache, ids, attn, 12, drop_at=4)
    assert [g.shape for g in got] == [r.shape for r in ref]
    assert max((g - r).abs().max().item() for g, r in zip(got, ref)) == 0.0
    layer = cache.layers[0]
    assert layer.get_seq_length() == width + 12 and layer.keys.shape[0] == 2
    assert layer._k.shape[-2] == width + 12  # grew to the limit, not past it


def test_the_cache_keyword_follows_the_forward_signature_and_its_deprecation_wrapper() -> None:
    import functools
    from types import SimpleNamespace

    from streamrl.models.cache_kwarg import cache_kwarg_of, returned_cache

    class Old(torch.nn.Module):
        def forward(self, input_ids=None, past_key_values=None): ...

    def renamed(fn):  # what transformers' deprecate_kwarg does to a forward: functools.wraps
        @functools.wraps(fn)
        def wrapper(*a, **k):
            return fn(*a, **k)

        return wrapper

    class New(torch.nn.Module):
        @renamed
        def forward(self, input_ids=None, cache=None, **kwargs): ...

    assert cache_kwarg_of(Old) == "past_key_values"
    assert cache_kwarg_of(New) == "cache"
    assert returned_cache(SimpleNamespace(cache="c", past_key_values=None)) == "c"
    assert returned_cache(SimpleNamespace(past_key_values="p")) == "p"
    assert returned_cache(SimpleNamespace(cache=None, past_key_values="p")) == "p"


def test_select_columns_keeps_each_rows_own_columns_in_order_and_the_capacity():
    """Row r of the result is row rows[r] restricted to columns[r]: keys and values alike, spare
    capacity kept for the next writes."""
    cache = growing_cache(initial=8, limit=8)
    k = torch.arange(2 * 1 * 5 * 2, dtype=torch.float32).view(2, 1, 5, 2)  # k[b, 0, c] = [10b + 2c, +1]
    cache.update(k, -k, 0)
    layer = cache.layers[0]
    layer.select_columns(torch.tensor([1, 1, 0]), torch.tensor([[0, 4, 2], [3, 3, 0], [1, 2, 3]]))
    assert layer.length == 3 and layer._k.shape == (3, 1, 8, 2)
    assert layer.keys[:, 0, :, 0].tolist() == [[10, 18, 14], [16, 16, 10], [2, 4, 6]]
    assert torch.equal(layer.values, -layer.keys)
    cache.update(torch.ones(3, 1, 1, 2), torch.ones(3, 1, 1, 2), 0)  # appends after the kept columns
    assert layer.keys[:, 0, :, 0].tolist() == [[10, 18, 14, 1], [16, 16, 10, 1], [2, 4, 6, 1]]


def _rows_cache(n: int):
    """A one-layer growing cache of n rows, row b's keys all 10 b + column, values their negatives."""
    cache = growing_cache(initial=6, limit=6)
    k = (10 * torch.arange(n, dtype=torch.float32)[:, None] + torch.arange(3.0)).view(n, 1, 3, 1)
    cache.update(k, -k, 0)
    return cache, cache.layers[0]


def test_select_indices_moves_only_the_rows_whose_index_changes_in_place():
    cache, layer = _rows_cache(4)
    buffer = layer._k.data_ptr()
    layer._k[1, 0, 5, 0] = 99.0  # past the filled columns: a row copied whole would carry it along
    cache.batch_select_indices(torch.tensor([0, 3, 3]))  # row 1 left, row 3 forked into its place
    assert layer._k.data_ptr() == buffer and layer.rows == 3
    assert layer.keys[:, 0, :, 0].tolist() == [[0, 1, 2], [30, 31, 32], [30, 31, 32]]
    assert torch.equal(layer.values, -layer.keys)
    assert layer._k[1, 0, 5, 0] == 99.0  # the filled columns only
    cache.update(torch.full((3, 1, 1, 1), 7.0), torch.full((3, 1, 1, 1), -7.0), 0)
    assert layer.keys[:, 0, :, 0].tolist() == [[0, 1, 2, 7], [30, 31, 32, 7], [30, 31, 32, 7]]
    cache.batch_select_indices(torch.tensor([2, 0, 1, 1, 0]))  # more rows than the buffer: a new one
    assert layer.rows == 5 and layer._k.shape[0] == 5 and layer._k.shape[-2] == 6
    assert layer.keys[:, 0, :, 0].tolist() == [
        [30, 31, 32, 7],
        [0, 1, 2, 7],
        [30, 31, 32, 7],
        [30, 31, 32, 7],
        [0, 1, 2, 7],
    ]
    assert torch.equal(layer.values, -layer.keys)


def test_a_swap_of_rows_reads_every_source_before_it_is_overwritten():
    cache, layer = _rows_cache(3)
    cache.batch_select_indices(torch.tensor([2, 0, 1]))
    assert layer.keys[:, 0, 0, 0].tolist() == [20, 0, 10]
    assert torch.equal(layer.values, -layer.keys)


def _filled(rows: int, columns: int, base: float, capacity: int = 8):
    """A one-layer growing cache of `rows` rows, row b's column c key base + 10 b + c, values negated."""
    cache = growing_cache(initial=capacity, limit=capacity)
    k = (base + 10 * torch.arange(rows, dtype=torch.float32)[:, None] + torch.arange(float(columns))).view(
        rows, 1, columns, 1
    )
    cache.update(k, -k, 0)
    return cache.layers[0]


def test_rows_that_fit_are_written_in_place_below_the_hosts():
    host = _filled(4, 5, 0.0)
    host.batch_select_indices(torch.tensor([0, 2]))  # two rows left: room for two more in the buffer
    host._k[2:, 0, :, 0] = float("nan")  # what the rows that left hold: never read again
    host._v[2:, 0, :, 0] = float("nan")
    buffer = host._k.data_ptr()
    joiner = _filled(2, 3, 100.0)
    assert host.absorb(joiner, skip=1) == 0  # in place: the one dead column is kept, not rewritten
    assert host._k.data_ptr() == buffer and host.rows == 4 and host.length == 5
    assert host.keys[:, 0, :, 0].tolist() == [
        [0, 1, 2, 3, 4],
        [20, 21, 22, 23, 24],
        [0, 0, 100, 101, 102],  # right-aligned, the padding zeros (not the NaN left behind)
        [0, 0, 110, 111, 112],
    ]
    assert torch.equal(host.values, -host.keys)
    host.update(torch.full((4, 1, 1, 1), 7.0), torch.full((4, 1, 1, 1), -7.0))  # decoding goes on
    assert host.keys[:, 0, -1, 0].tolist() == [7, 7, 7, 7] and host.length == 6


def test_rows_that_do_not_fit_rebuild_the_cache_without_its_dead_columns():
    host = _filled(2, 5, 0.0)  # a full buffer: no spare row
    joiner = _filled(1, 3, 100.0)
    assert host.absorb(joiner, skip=2) == 2
    assert host.rows == 3 and host.length == 3
    assert host.keys[:, 0, :, 0].tolist() == [[2, 3, 4], [12, 13, 14], [100, 101, 102]]
    assert torch.equal(host.values, -host.keys)
    wider = _filled(1, 6, 200.0)  # wider than the host: the host's rows are padded instead
    assert host.absorb(wider, skip=0) == 0
    assert host.keys[:, 0, :, 0].tolist() == [
        [0, 0, 0, 2, 3, 4],
        [0, 0, 0, 12, 13, 14],
        [0, 0, 0, 100, 101, 102],
        [200, 201, 202, 203, 204, 205],
    ]
    assert torch.equal(host.values, -host.keys)


def test_many_dead_columns_are_dropped_even_when_the_rows_fit():
    host = _filled(4, 8, 0.0)
    host.batch_select_indices(torch.tensor([1]))
    assert host.absorb(_filled(1, 2, 100.0), skip=2) == 2  # a quarter of the width is dead: rebuilt
    assert host.keys[:, 0, :, 0].tolist() == [[12, 13, 14, 15, 16, 17], [0, 0, 0, 0, 100, 101]]


def test_next_rows_keeps_continuations_in_their_parents_rows_and_fills_the_rows_that_left():
    from streamrl.engine.kv_cache import next_rows

    # cache row 0 forks (tokens 5 and 6), rows 3 and 4 share cache row 2 and token 8
    rows, src, fed = next_rows([0, 0, 1, 2, 2, 3], [5, 6, 7, 8, 8, 9], share=True)
    assert (rows, src, fed) == ([0, 4, 1, 2, 2, 3], [0, 1, 2, 3, 0], [5, 7, 8, 9, 6])
    # cache row 1's rows finished: cache row 3 moves into its place, the others stay
    assert next_rows([0, 2, 3], [1, 2, 3], share=True) == ([0, 2, 1], [0, 3, 2], [1, 3, 2])
    # unshared: one cache row per row, even for equal tokens
    assert next_rows([0, 0, 2], [4, 4, 4], share=False) == ([0, 1, 2], [0, 0, 2], [4, 4, 4])


def test_the_cache_finds_the_moved_rows_once_for_all_its_layers(monkeypatch):
    from streamrl.engine import kv_cache

    calls = []
    found = kv_cache.moved_rows
    monkeypatch.setattr(kv_cache, "moved_rows", lambda indices: calls.append(1) or found(indices))
    cache = growing_cache(initial=6, limit=6)
    k = (10 * torch.arange(3, dtype=torch.float32)[:, None] + torch.arange(2.0)).view(3, 1, 2, 1)
    for layer_idx in range(3):
        cache.update(k + layer_idx, -k, layer_idx)
    cache.batch_select_indices(torch.tensor([2, 1, 2]))  # row 0 takes row 2's place and keeps it
    assert len(calls) == 1
    for layer_idx, layer in enumerate(cache.layers):
        assert (layer.keys[:, 0, :, 0] - layer_idx).tolist() == [[20, 21], [10, 11], [20, 21]]
        assert layer.values[:, 0, :, 0].tolist() == [[-20, -21], [-10, -11], [-20, -21]]
