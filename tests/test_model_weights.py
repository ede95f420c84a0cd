"""A local model directory whose weights transformers cannot load, or whose config.json is not JSON, is
refused in one line naming the file and the fix, before anything loads or is written: no weights, a
shard index naming shards that are not there, a safetensors file cut short (its header read, no tensor),
a PyTorch checkpoint cut short (its zip directory read, or in the legacy format its pickles: no tensor),
a config.json that is not JSON. A sharded directory with every shard loads as usual. The fix suits the
directory: a model streamrl built into its cache is deleted and rebuilt, a Hub snapshot downloaded again
(tests/test_hub_models.py)."""

from __future__ import annotations

import json
import pickle
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
from tiny_args import TINY

from streamrl.cli import main
from streamrl.models import resolve_model_dir


def _tiny_copy(tmp_path: Path, change: Callable[[Path], None]) -> Path:
    d = tmp_path / "model"
    shutil.copytree(resolve_model_dir("tiny-random", seed=0), d)
    change(d)
    return d


def _truncate(d: Path) -> None:
    weights = d / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])


def _sharded_without_one(d: Path) -> None:
    (d / "model.safetensors").unlink()
    weight_map = {
        "a.weight": "model-00001-of-00002.safetensors",
        "b.weight": "model-00002-of-00002.safetensors",
    }
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (d / "model-00001-of-00002.safetensors").write_bytes(b"")


def _to_bin(d: Path, shards: int = 1, legacy: bool = False) -> list[str]:
    """Replace model.safetensors with the same tensors as PyTorch checkpoints (torch.save's zip format,
    or its legacy one): pytorch_model.bin, or `shards` shards and their index -> the checkpoint files,
    in order."""
    import torch
    from safetensors.torch import load_file

    tensors = load_file(d / "model.safetensors")
    (d / "model.safetensors").unlink()
    if shards == 1:
        torch.save(tensors, d / "pytorch_model.bin", _use_new_zipfile_serialization=not legacy)
        return ["pytorch_model.bin"]
    names = [f"pytorch_model-0000{i + 1}-of-0000{shards}.bin" for i in range(shards)]
    weight_map = {key: names[i % shards] for i, key in enumerate(sorted(tensors))}
    for name in names:
        torch.save({k: t for k, t in tensors.items() if weight_map[k] == name}, d / name)
    (d / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return names


def _cut_half(file: Path) -> None:
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2])


BIN_CUT = "is not a whole PyTorch checkpoint (its zip directory cannot be read: the file is cut short)"

CASES = [
    (
        lambda d: (d / "model.safetensors").unlink(),
        "no weights in {d} (model.safetensors, model.safetensors.index.json with its shards, or "
        "pytorch_model.bin): copy them from the base model",
    ),
    (
        _truncate,
        "{d}/model.safetensors is not a whole safetensors file (it holds {half} bytes where its header "
        "describes {full}): copy it again from the base model",
    ),
    (
        lambda d: (d / "config.json").write_text("{bad\n"),
        "{d}/config.json is not valid JSON (Expecting property name enclosed in double quotes: line 1 "
        "column 2 (char 1)): restore it from the base model",
    ),
    (
        _sharded_without_one,
        "{d} lacks 1 of the 2 shards its index names (model-00002-of-00002.safetensors): copy it again "
        "from the base model",
    ),
    (
        lambda d: ((d / "model.safetensors").unlink(), (d / "model.safetensors.index.json").write_text("{")),
        "{d}/model.safetensors.index.json is not a shard index (JSON with a weight_map): copy it again "
        "from the base model",
    ),
    (
        lambda d: _cut_half(d / _to_bin(d)[0]),
        "{d}/pytorch_model.bin " + BIN_CUT + ": copy it again from the base model",
    ),
    (
        lambda d: _cut_half(d / _to_bin(d, shards=2)[1]),
        "{d}/pytorch_model-00002-of-00002.bin " + BIN_CUT + ": copy it again from the base model",
    ),
]
IDS = [
    "no-weights",
    "truncated",
    "config-not-json",
    "shard-missing",
    "index-not-json",
    "bin-truncated",
    "bin-shard-truncated",
]


def _expected(d: Path, message: str) -> str:
    full = (resolve_model_dir("tiny-random", seed=0) / "model.safetensors").stat().st_size
    return f"model={d}: " + message.format(d=d, half=full // 2, full=full)


@pytest.mark.parametrize(("change", "message"), CASES, ids=IDS)
def test_weights_or_config_transformers_cannot_load_are_one_line_before_anything_is_written(
    tmp_path, capsys, change, message
):
    model = _tiny_copy(tmp_path, change)
    run = tmp_path / "run"
    assert main(["train", *TINY, f"model={model}", f"run_dir={run}"]) == 2
    assert capsys.readouterr().err == f"streamrl: error: {_expected(model, message)}\n"
    assert not run.exists()


def test_eval_refuses_missing_weights_in_one_line_before_writing(tmp_path, capsys):
    model = _tiny_copy(tmp_path, CASES[0][0])
    run = tmp_path / "run"
    assert main(["eval", f"model={model}", "size=4", "eval.max_new_tokens=8", f"run_dir={run}"]) == 2
    assert capsys.readouterr().err == f"streamrl: error: {_expected(model, CASES[0][1])}\n"
    assert not run.exists()


def test_the_python_api_refuses_a_truncated_weights_file_in_one_line(tmp_path):
    import streamrl

    model = _tiny_copy(tmp_path, _truncate)
    run = tmp_path / "run"
    with pytest.raises(ValueError) as e:
        streamrl.train(model=str(model), run_dir=str(run), max_steps=1)
    assert str(e.value) == _expected(model, CASES[1][1])
    assert not run.exists()


def test_an_adapter_directory_with_a_config_json_is_named_an_adapter(tmp_path, capsys):
    """A PEFT adapter saved with its base model's config.json has no model weights: the advice is the
    adapter's (its merged model), not to copy weights from the base model."""

    def adapter(d: Path) -> None:
        (d / "model.safetensors").rename(d / "adapter_model.safetensors")
        (d / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA"}))

    model = _tiny_copy(tmp_path, adapter)
    assert main(["train", *TINY, f"model={model}", f"run_dir={tmp_path / 'run'}"]) == 2
    assert capsys.readouterr().err == (
        f"streamrl: error: model '{model}': a PEFT adapter (adapter_config.json), not a model: give its "
        "base model with the adapter merged in (PEFT's merge_and_unload, then save_pretrained)\n"
    )
    assert not (tmp_path / "run").exists()


def test_a_header_past_safetensors_limit_is_not_read(tmp_path):
    from streamrl.models.weight_files import MAX_HEADER, safetensors_problem

    f = tmp_path / "model.safetensors"
    with f.open("wb") as out:  # a sparse file: 8 + MAX_HEADER + 1 bytes, its length field MAX_HEADER + 1
        out.write((MAX_HEADER + 1).to_bytes(8, "little"))
        out.truncate(8 + MAX_HEADER + 1)
    assert (
        safetensors_problem(f)
        == f"its header claims {MAX_HEADER + 1} bytes, past safetensors' limit of {MAX_HEADER}"
    )


def test_a_sharded_directory_with_every_shard_loads(tmp_path):
    from streamrl.models import load_model

    original = load_model(resolve_model_dir("tiny-random", seed=0))

    def shard(d: Path) -> None:
        (d / "model.safetensors").unlink()
        original.save_pretrained(d, max_shard_size="100KB")

    model = _tiny_copy(tmp_path, shard)
    assert len(list(model.glob("model-*.safetensors"))) > 1
    assert resolve_model_dir(str(model)) == model
    assert load_model(model) is not None


def test_a_whole_pytorch_checkpoint_passes_in_either_layout(tmp_path):
    single = _tiny_copy(tmp_path / "a", _to_bin)
    sharded = _tiny_copy(tmp_path / "b", lambda d: _to_bin(d, shards=2))
    assert resolve_model_dir(str(single)) == single
    assert resolve_model_dir(str(sharded)) == sharded


def test_a_pytorch_checkpoint_is_told_by_its_first_bytes_and_zip_directory(tmp_path):
    """torch.save's zip archive must name a data.pkl; a legacy checkpoint starts as a pickle (its
    pickles are skimmed below); anything else is neither."""
    import torch

    from streamrl.models.weight_files import pytorch_problem

    legacy, other_zip, text = tmp_path / "legacy.bin", tmp_path / "other.bin", tmp_path / "text.bin"
    torch.save({"w": torch.ones(2)}, legacy, _use_new_zipfile_serialization=False)
    with zipfile.ZipFile(other_zip, "w") as z:
        z.writestr("archive/version", "3")
    text.write_text("version https://git-lfs.github.com/spec/v1\n")  # a Git LFS pointer, say
    assert legacy.read_bytes()[:2] == b"\x80\x02"
    assert pytorch_problem(legacy) == ""
    assert pytorch_problem(other_zip) == "its zip archive holds no data.pkl"
    assert pytorch_problem(text) == "it is neither a zip archive nor a pickle"


def test_a_zip_checkpoint_cut_anywhere_is_cut_short(tmp_path):
    """Its central directory ends the file: a cut anywhere, one byte short included, leaves none."""
    import torch

    from streamrl.models.weight_files import pytorch_problem

    whole, cut = tmp_path / "whole.bin", tmp_path / "cut.bin"
    torch.save({"w": torch.ones(3), "i": torch.arange(4)}, whole)
    data = whole.read_bytes()
    assert pytorch_problem(whole) == ""
    for n in (len(data) - 1, len(data) - 22, len(data) - 200, len(data) // 2, 10):
        cut.write_bytes(data[:n])
        assert pytorch_problem(cut) == "its zip directory cannot be read: the file is cut short", n


def _legacy_checkpoint(file: Path) -> bytes:
    """torch.save's legacy format of three tensors whose storages take 72 bytes after the pickles:
    (8 + 3 * 4) + (8 + 2 * 2) + (8 + 4 * 8) -> the file's bytes."""
    import torch

    tensors = {"w": torch.ones(3), "b": torch.zeros(2, dtype=torch.bfloat16), "i": torch.arange(4)}
    torch.save(tensors, file, _use_new_zipfile_serialization=False)
    return file.read_bytes()


def test_a_legacy_checkpoint_cut_short_is_told_by_its_pickles(tmp_path):
    """Its pickles are read (nothing they name is imported), and the storages' bytes they describe must
    fit in the file: no tensor is read."""
    from streamrl.models.weight_files import pytorch_problem

    whole, cut = tmp_path / "whole.bin", tmp_path / "cut.bin"
    data = _legacy_checkpoint(whole)
    size = len(data)
    assert pytorch_problem(whole) == ""
    for n in (size - 1, size - 40, size - 72):  # in the storages' bytes, or right before them
        cut.write_bytes(data[:n])
        assert pytorch_problem(cut) == f"it holds {n} bytes where its pickles describe {size}", n
    for n in (2, 40, size - 73):  # in the pickles (the last one's final byte, at the latest)
        cut.write_bytes(data[:n])
        assert pytorch_problem(cut) == "its pickles cannot be read: the file is cut short", n
    cut.write_bytes(data + b"\0")  # torch reads no further than the storages
    assert pytorch_problem(cut) == ""
    cut.write_bytes(pickle.dumps({"w": 1}, protocol=2))
    assert pytorch_problem(cut) == "it is a pickle without torch.save's magic number"


class _Runs:
    """Pickles as a call of exec: loading it runs code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (exec, (f"open({str(self.marker)!r}, 'w').close()",))


def test_a_legacy_checkpoint_is_read_without_running_what_it_names(tmp_path):
    from streamrl.models.weight_files import LEGACY_MAGIC, pytorch_problem

    marker, file = tmp_path / "ran", tmp_path / "w.bin"
    parts = (LEGACY_MAGIC, 1001, {"little_endian": True}, {"w": _Runs(marker)}, [])
    file.write_bytes(b"".join(pickle.dumps(x, protocol=2) for x in parts))
    assert pytorch_problem(file) == "" and not marker.exists()
    file.write_bytes(file.read_bytes()[:-1])
    assert pytorch_problem(file) == "its pickles cannot be read: the file is cut short"
    assert not marker.exists()


def test_a_legacy_checkpoints_storage_types_saved_on_a_gpu_or_unknown_still_count(tmp_path):
    """A GPU's storage type (torch.cuda.FloatStorage) counts as the CPU's; one this does not know counts
    its 8-byte length only, and the others are still checked (the sum a lower bound)."""
    from streamrl.models.weight_files import pytorch_problem

    data = _legacy_checkpoint(tmp_path / "whole.bin")
    file = tmp_path / "w.bin"
    gpu = data.replace(b"ctorch\nFloatStorage\n", b"ctorch.cuda\nFloatStorage\n")
    unknown = data.replace(b"ctorch\nLongStorage\n", b"ctorch\nFutureStorage\n")
    assert gpu != data and unknown != data
    for body, uncounted in ((gpu, 0), (unknown, 4 * 8)):  # the unknown storage: 4 longs not counted
        described = len(body) - uncounted
        file.write_bytes(body)
        assert pytorch_problem(file) == ""
        n = len(body) - 72  # every storage's bytes gone
        file.write_bytes(body[:n])
        assert pytorch_problem(file) == f"it holds {n} bytes where its pickles describe {described}"


def test_a_legacy_pickle_loading_by_extension_code_is_refused_unread(tmp_path):
    """EXT1 loads whatever copyreg registered under its code, past find_class: refused before any
    pickle is loaded, and copyreg's cache is left as it was."""
    import copyreg

    from streamrl.models.weight_files import LEGACY_MAGIC, pytorch_problem

    head = b"".join(pickle.dumps(x, protocol=2) for x in (LEGACY_MAGIC, 1001, {"little_endian": True}))
    file = tmp_path / "w.bin"
    cache = dict(copyreg._extension_cache)
    file.write_bytes(head + b"\x80\x02\x82\x01." + pickle.dumps([], protocol=2))  # EXT1 code 1
    refused = "its pickles load objects by extension code, which torch.save never writes"
    assert pytorch_problem(file) == refused
    assert copyreg._extension_cache == cache
    file.write_bytes(head + b"\x80\x02U\x02\xc3\xa9." + pickle.dumps([], protocol=2))  # a Python 2 str
    assert pytorch_problem(file) == ""


def test_a_legacy_checkpoint_cut_short_is_refused_naming_it_and_the_fix(tmp_path):
    from streamrl.models.weight_files import weights_problem

    d = _tiny_copy(tmp_path, lambda d: _to_bin(d, legacy=True))
    f = d / "pytorch_model.bin"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])
    assert weights_problem(d) == (
        f"{f} is not a whole PyTorch checkpoint (it holds {len(data) // 2} bytes where its pickles "
        f"describe {len(data)}): copy it again from the base model"
    )


def test_a_cut_short_build_in_the_cache_is_deleted_and_built_again(tmp_path, monkeypatch):
    """tiny-random (like smollm2-135m-instruct) is built once into streamrl's cache: a build cut short
    is not copied from any base model, it is deleted, and the next use builds it again."""
    monkeypatch.setenv("STREAMRL_CACHE", str(tmp_path / "cache"))
    built = resolve_model_dir("tiny-random", seed=0)
    assert built == tmp_path / "cache" / "models" / "tiny-random-v2-seed0"
    full = (built / "model.safetensors").stat().st_size
    _truncate(built)
    with pytest.raises(ValueError) as e:
        resolve_model_dir("tiny-random", seed=0)
    assert str(e.value) == (
        f"model=tiny-random: {built}/model.safetensors is not a whole safetensors file (it holds "
        f"{full // 2} bytes where its header describes {full}): delete {built} so it is rebuilt"
    )
    shutil.rmtree(built)  # as told
    assert resolve_model_dir("tiny-random", seed=0) == built
    assert (built / "model.safetensors").stat().st_size == full


def test_the_way_out_suits_where_the_directory_came_from(tmp_path, monkeypatch):
    from streamrl.models import smollm2
    from streamrl.models.weight_files import way_out

    monkeypatch.setenv("STREAMRL_CACHE", str(tmp_path / "cache"))
    converted = smollm2.converted_dir()
    snap = tmp_path / "hub" / "models--org--name" / "snapshots" / "abc123"
    assert way_out(converted, ["model.safetensors"]) == f"delete {converted} so it is rebuilt"
    assert way_out(converted) == f"delete {converted} so it is rebuilt"
    assert way_out(snap, ["model-00002-of-00002.safetensors"]) == (
        "download it again: `hf download org/name model-00002-of-00002.safetensors --revision abc123 "
        "--force-download`"
    )
    assert way_out(tmp_path / "model", ["pytorch_model.bin"]) == "copy it again from the base model"
    assert way_out(tmp_path / "model") == "copy them from the base model"


def test_a_hub_snapshot_short_of_weights_downloads_only_those_again(tmp_path, monkeypatch):
    """Never the whole repository (`hf download REPO --force-download` fetches every file of it): the
    shards it lacks by name, or with no weight set at all the safetensors weights by pattern."""
    from streamrl.models.weight_files import weights_problem

    monkeypatch.setenv("STREAMRL_CACHE", str(tmp_path / "cache"))
    snap = tmp_path / "hub" / "models--org--name" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    shards = [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    weight_map = {f"w{i}": shard for i, shard in enumerate(shards)}
    (snap / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (snap / shards[0]).write_bytes(b"")
    assert weights_problem(snap) == (
        f"{snap} lacks 2 of the 3 shards its index names ({shards[1]} and 1 more): download them again: "
        f"`hf download org/name {shards[1]} {shards[2]} --revision abc123 --force-download`"
    )
    for file in (snap / "model.safetensors.index.json", snap / shards[0]):
        file.unlink()
    assert weights_problem(snap) == (
        f"no weights in {snap} (model.safetensors, model.safetensors.index.json with its shards, or "
        'pytorch_model.bin): download them: `hf download org/name --include "model*.safetensors*" '
        "--revision abc123` (for a repository without safetensors weights: `hf download org/name --include "
        '"pytorch_model*.bin*" --revision abc123`)'
    )


@pytest.mark.parametrize("check", ["pytorch_problem", "safetensors_problem"])
def test_a_read_error_without_a_system_reason_shows_its_own_text(tmp_path, monkeypatch, check):
    from streamrl.models import weight_files

    def fails(self, *args, **kwargs):
        raise OSError("the mount went away")

    (tmp_path / "w").write_bytes(b"PK")
    monkeypatch.setattr(weight_files.Path, "open", fails)
    assert getattr(weight_files, check)(tmp_path / "w") == "it cannot be read: the mount went away"
