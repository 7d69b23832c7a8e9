"""The float64 replay on real dumps made by Parity's client: which side's kernel is wrong, forward and
backward, what a clean pair says, and every refusal (missing file, randomness, unknown or custom API, in-place
overwrite, unsafe files and names)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch
from parity.client import PrecisionDebugger
from parity.shared.compare.expected_error import REPLAY_SAFETY, rounding_bound
from parity.shared.compare.job import run_compare
from parity.shared.compare.options import CompareOptions
from parity.shared.compare.spec import load_compare_spec
from parity.shared.replay import apis, engine
from parity.shared.replay.apis import ReplayRefusal, resolve
from parity.shared.replay.engine import Verdict, replay_calls, replay_files
from parity.shared.replay.rounding import rounding_allowance

from tests.factories import DumpBuilder
from tests.replay_dumps import (
    GELU,
    copy_dump,
    dump_model,
    entry,
    write_compare_json,
    wrong_backward_gelu,
    wrong_forward_gelu,
)

GELU_BACKWARD = "Functional.gelu.0.backward"


@pytest.fixture(scope="module")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("replay")
    return {
        "bench": dump_model(root / "bench"),
        "forward_fault": dump_model(root / "forward_fault", gelu=wrong_forward_gelu()),
        "backward_fault": dump_model(root / "backward_fault", gelu=wrong_backward_gelu()),
        "other_inputs": dump_model(root / "other_inputs", input_noise=1e-3),  # no kernel wrong
    }


def one(target: Path, bench: Path, name: str, **kwargs: object):  # type: ignore[no-untyped-def]
    (verdict,) = replay_calls(target, bench, [name], **kwargs)  # type: ignore[arg-type]
    return verdict


def test_a_wrong_forward_kernel_is_blamed_on_its_side(dumps: dict[str, Path]) -> None:
    v = one(dumps["forward_fault"], dumps["bench"], GELU)
    assert v.verdict is Verdict.TARGET, v.text
    assert v.target.distance is not None and v.target.distance > 1e-3
    assert v.bench.distance is not None and v.bench.distance < 1e-6
    assert v.text.startswith("target output ") and v.text.endswith("the target's kernel is wrong"), v.text
    assert "from its float64 replay, bench " in v.text and "rounding allows" in v.text
    swapped = one(dumps["bench"], dumps["forward_fault"], GELU)  # the faulty dump as the bench
    assert swapped.verdict is Verdict.BENCH, swapped.text
    assert swapped.text.endswith("the bench's kernel is wrong")


def test_a_wrong_backward_kernel_is_blamed_through_autograd(dumps: dict[str, Path]) -> None:
    v = one(dumps["backward_fault"], dumps["bench"], GELU_BACKWARD)
    assert v.verdict is Verdict.TARGET, v.text
    assert v.direction == "backward" and v.text.startswith("target input gradients ")
    assert v.target.distance is not None and v.target.distance > 1e-3
    # its forward is right: the forward replay clears it
    assert one(dumps["backward_fault"], dumps["bench"], GELU).verdict is Verdict.NEITHER


def test_a_pair_whose_inputs_differ_and_whose_kernels_are_right_blames_neither(dumps: dict[str, Path]
                                                                               ) -> None:  # fmt: skip
    data = json.loads(dumps["bench"].read_text())["data"]
    replayable = [n for n in data if "dropout.0" not in n and "ones_like" not in n]
    verdicts = replay_calls(dumps["other_inputs"], dumps["bench"], replayable)
    blamed = [v.text for v in verdicts if v.verdict is not Verdict.NEITHER]
    assert not blamed, blamed
    for v in verdicts:  # every correct call sits well inside its allowance
        for side in (v.target, v.bench):
            assert side.distance is not None and side.allowance is not None
            assert side.distance < side.allowance / 4, v.text
    backward = [v for v in verdicts if v.direction == "backward"]
    assert len(backward) >= 6  # linear, layer_norm, gelu, add_, softmax, pow, mean, dropout (off)


def test_in_place_calls_replay_from_the_inputs_they_saw(dumps: dict[str, Path]) -> None:
    for name in ("Tensor.add_.0.forward", "Tensor.add_.0.backward", "Functional.dropout.1.forward"):
        v = one(dumps["forward_fault"], dumps["bench"], name)
        assert v.verdict is Verdict.NEITHER, (name, v.text)


def test_an_input_overwritten_in_place_before_it_was_saved_is_refused(dumps: dict[str, Path],
                                                                      tmp_path: Path) -> None:  # fmt: skip
    target = copy_dump(dumps["bench"], tmp_path / "rank0")
    record = entry(target, "Tensor.add_.0.forward")
    tensors = target.parent / "dump_tensor_data"
    # what a writer that saves late leaves: the input's file holds the value after the update
    (tensors / record["input_args"][0]["data_name"]).write_bytes(
        (tensors / record["output"][0]["data_name"]).read_bytes()
    )
    v = one(target, dumps["bench"], "Tensor.add_.0.forward")
    assert v.verdict is Verdict.UNDECIDED, v.text
    assert v.target.refusal is not None and "overwritten in place" in v.target.refusal
    assert "target input.0" in v.target.refusal


def test_a_missing_tensor_file_is_refused_by_name(dumps: dict[str, Path], tmp_path: Path) -> None:
    target = copy_dump(dumps["forward_fault"], tmp_path / "rank0")
    name = entry(target, GELU)["input_args"][0]["data_name"]
    (target.parent / "dump_tensor_data" / name).unlink()
    v = one(target, dumps["bench"], GELU)
    assert v.target.refusal == f"target input.0: missing tensor file {name}"
    assert v.verdict is Verdict.UNDECIDED  # the bench alone replays, within rounding
    assert "target not replayed (target input.0: missing tensor file" in v.text


def test_randomness_unknown_apis_and_modules_are_refused(dumps: dict[str, Path]) -> None:
    d = dumps["bench"]
    random, unknown = replay_calls(d, d, ["Functional.dropout.0.forward", "Torch.ones_like.0.forward"])
    assert random.verdict is Verdict.NOT_REPLAYED
    assert random.text == ("not replayed: randomness: Functional.dropout draws random numbers (p=0.25, "
                           "training=True); no replay reproduces its output")  # fmt: skip
    assert unknown.text == "not replayed: unknown API: Torch.ones_like is not on the replay allow-list"
    (module,) = replay_calls(d, d, ["Module.fc1.Linear.forward.0"])
    assert module.target.refusal is not None and module.target.refusal.startswith("module call")


def test_recorded_arguments_that_do_not_fit_the_api_are_refused_with_its_message(
        dumps: dict[str, Path], tmp_path: Path) -> None:  # fmt: skip
    """A linear recorded without its weight (a damaged or hand-made dump) is refused by what binding the
    arguments said, not as a replay whose size cannot be bounded."""
    target = copy_dump(dumps["bench"], tmp_path / "rank0")
    doc = json.loads(target.read_text())
    doc["data"]["Functional.linear.0.forward"]["input_args"] = doc["data"]["Functional.linear.0.forward"][
        "input_args"][:1]
    target.write_text(json.dumps(doc))
    v = one(target, dumps["bench"], "Functional.linear.0.forward")
    assert v.target.refusal is not None, v.text
    assert v.target.refusal.startswith("its recorded arguments do not make a valid call of linear: "), v.text
    assert v.verdict is Verdict.UNDECIDED  # the bench replays, within rounding


def test_a_custom_op_is_refused(tmp_path: Path) -> None:
    x = torch.randn(4, 4)
    dump = DumpBuilder("tensor").api("NPU.npu_fusion_attention.0.forward", inputs=[x, x, x], outputs=[x])
    path = dump.write(tmp_path / "rank0")
    (v,) = replay_calls(path, path, ["NPU.npu_fusion_attention.0.forward"])
    assert v.verdict is Verdict.NOT_REPLAYED
    assert v.text.startswith("not replayed: custom op: NPU.npu_fusion_attention is not a torch API")


@pytest.mark.parametrize(("prefix", "api"), [
    ("Torch", "load"), ("Torch", "save"), ("Torch", "__import__"), ("Tensor", "__reduce_ex__"),
    ("Functional", "__builtins__"), ("Torch", "ops"), ("os", "system"), ("builtins", "eval"),
    ("Torch", "hub.load"), ("Tensor", "register_hook"), ("Functional", "__globals__"),
])  # fmt: skip
def test_the_allow_list_resolves_nothing_a_dump_could_abuse(prefix: str, api: str) -> None:
    with pytest.raises(ReplayRefusal, match="custom op|unknown API"):
        resolve(prefix, api)


def test_a_malicious_api_name_in_a_dump_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    dump = DumpBuilder("tensor").api("Torch.system.0.forward", inputs=[f"touch {marker}"],
                                     outputs=[torch.zeros(1)])  # fmt: skip
    dump.data["Torch.eval.0.forward"] = dump.data["Torch.system.0.forward"]
    path = dump.write(tmp_path / "rank0")
    verdicts = replay_calls(path, path, ["Torch.system.0.forward", "Torch.eval.0.forward"])
    assert all(v.verdict is Verdict.NOT_REPLAYED and "unknown API" in v.text for v in verdicts)
    assert not marker.exists()


def test_replay_sources_never_evaluate_or_import_by_name() -> None:
    folder = Path(apis.__file__).parent
    for source in folder.glob("*.py"):
        text = source.read_text()
        for banned in ("eval(", "exec(", "import_module", "__import__(", "pickle.load", "weights_only=False"):
            assert banned not in text, (source.name, banned)


def test_unsafe_tensor_files_and_names_are_refused(dumps: dict[str, Path], tmp_path: Path) -> None:
    target = copy_dump(dumps["bench"], tmp_path / "rank0")
    doc = json.loads(target.read_text())
    record = doc["data"][GELU]["input_args"][0]
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            return (Path.touch, (marker,))

    exploit = pickle.dumps(Exploit(), protocol=2)
    (target.parent / "dump_tensor_data" / record["data_name"]).write_bytes(exploit)
    v = one(target, dumps["bench"], GELU)
    assert v.target.refusal is not None and "refused" in v.target.refusal, v.target.refusal
    assert not marker.exists()
    record["data_name"] = "../../../etc/passwd"
    target.write_text(json.dumps(doc))
    v = one(target, dumps["bench"], GELU)
    assert v.target.refusal is not None and "is not a plain file name" in v.target.refusal


def test_a_replay_too_large_is_refused_before_it_runs(dumps: dict[str, Path],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    v = one(dumps["bench"], dumps["bench"], "Functional.linear.0.forward", max_elements=100)
    assert v.verdict is Verdict.NOT_REPLAYED and "elements" in v.text, v.text
    # the linear's addmm: 6 x 8 x 16 x 2 = 1536 floating-point operations and 288 elements read and written
    monkeypatch.setattr(engine, "MAX_FLOPS", 1000)
    v = one(dumps["bench"], dumps["bench"], "Functional.linear.0.forward")
    expected = ("over budget: its replay would take 1.8e+03 operations (aten.addmm: 1.8e+03), over the cap "
                "of 1.0e+03")
    assert v.text == f"not replayed: {expected}", v.text


def test_the_allowance_grows_with_the_reduction_and_the_dtype(dumps: dict[str, Path]) -> None:
    # the compare's one expected-error model, times the replay's safety
    assert rounding_allowance(torch.float32, 4096) == REPLAY_SAFETY * rounding_bound(2.0**-24, 4096)
    assert rounding_allowance(torch.float32, 4096) > 30 * rounding_allowance(torch.float32, 1)
    assert rounding_allowance(torch.float16, 1) > 1000 * rounding_allowance(torch.float32, 1)
    layer_norm = one(dumps["bench"], dumps["bench"], "Functional.layer_norm.0.forward")
    assert layer_norm.target.reduction_length == 16  # the normalized size
    linear = one(dumps["bench"], dumps["bench"], "Functional.linear.0.forward")
    assert linear.target.reduction_length == 8  # in_features


def test_replay_files_names_what_a_worker_must_fetch(dumps: dict[str, Path]) -> None:
    names = replay_files(dumps["bench"], [GELU_BACKWARD])
    assert f"{GELU}.input.0.pt" in names and f"{GELU_BACKWARD}.input.0.pt" in names
    assert all((dumps["bench"].parent / "dump_tensor_data" / n).is_file() for n in names)


def test_compare_replays_its_top_suspects_into_summary_and_advisor(dumps: dict[str, Path],
                                                                   tmp_path: Path) -> None:  # fmt: skip
    spec = write_compare_json(tmp_path / "compare.json", dumps["forward_fault"], dumps["bench"])
    outputs = run_compare(load_compare_spec(spec), tmp_path / "out", CompareOptions())
    summary = json.loads(outputs.summary.read_text())  # type: ignore[union-attr]
    verdicts = {v["entry"]: v for v in summary["replay"]["verdicts"]}
    assert verdicts[GELU]["verdict"] == "target", verdicts
    assert summary["first_divergence"]["api"] in verdicts  # the first divergence is always replayed
    advisor = outputs.advisors[0].read_text()
    assert "Float64 replay" in advisor and f"- [target] {GELU}: target output " in advisor
    off = run_compare(load_compare_spec(spec), tmp_path / "off", CompareOptions(replay_top=0))
    assert off.results[0].replay is None


def test_statistics_mode_says_once_that_there_is_no_replay(tmp_path: Path) -> None:
    x = torch.randn(4, 4)
    for side, y in (("npu", x * 2), ("bench", x)):
        DumpBuilder("statistics").api("Torch.mul.0.forward", inputs=[x, 2.0], outputs=[y]).write(
            tmp_path / side / "rank0")  # fmt: skip
    spec = write_compare_json(tmp_path / "compare.json", tmp_path / "npu" / "rank0" / "dump.json",
                              tmp_path / "bench" / "rank0" / "dump.json")  # fmt: skip
    outputs = run_compare(load_compare_spec(spec), tmp_path / "out", CompareOptions())
    summary = json.loads(outputs.summary.read_text())  # type: ignore[union-attr]
    assert summary["replay"] == {"verdicts": [], "note": "statistics mode: no float64 replay (the dumps hold "
                                                         "no tensors)"}  # fmt: skip
    assert outputs.advisors[0].read_text().count("no float64 replay") == 1


@pytest.mark.parametrize("kind", ["cnn", "lstm", "transformer"])
def test_every_call_of_the_client_test_models_replays_clean(tmp_path: Path, kind: str) -> None:
    """A convolution and a batch norm (the conv's bias gradient cancels to rounding), ``VF.lstm`` and an
    indexed output, embedding and attention: a correct run is never blamed; the rest says why not."""
    from tests.client.conftest import dump_once

    root = dump_once(tmp_path, kind, "L1", task="tensor")
    PrecisionDebugger.reset()
    dump = root / "step0" / "rank0" / "dump.json"
    names = list(json.loads(dump.read_text())["data"])
    verdicts = {v.entry: v for v in replay_calls(dump, dump, names)}
    assert {v.verdict for v in verdicts.values()} <= {Verdict.NEITHER, Verdict.NOT_REPLAYED}, [
        v.text for v in verdicts.values() if v.verdict not in (Verdict.NEITHER, Verdict.NOT_REPLAYED)]
    refused = [v.text for v in verdicts.values() if v.verdict is not Verdict.NEITHER]
    assert len(refused) <= 3, refused  # dropout (both ways), Torch.ones_like / Torch.zeros, an int add_
    keys = {
        "cnn": ("Functional.conv2d.0.backward", "Functional.batch_norm.0.backward"),
        "lstm": ("VF.lstm.0.forward", "VF.lstm.0.backward", "Tensor.__getitem__.0.forward"),
        "transformer": ("Functional.embedding.0.backward", "Tensor.__matmul__.1.backward"),
    }[kind]
    for key in keys:
        assert verdicts[key].verdict is Verdict.NEITHER, verdicts[key].text


def test_an_output_that_holds_float16_values_only_was_computed_in_float16() -> None:
    """The trace an fp16-internal kernel leaves in a float32 output, whatever its distance from float64; a
    copy of inputs that already fit, and too few elements to tell, say nothing."""
    from parity.shared.replay.precision import held_format

    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(0))
    assert held_format([torch.tanh(x.half()).float()], [x]) == "float16"
    assert held_format([torch.tanh(x.bfloat16()).float()], [x]) == "bfloat16"
    assert held_format([torch.tanh(x)], [x]) is None
    assert held_format([x.half().float()], [x.half().float()]) is None  # its inputs fit already
    assert held_format([torch.tanh(x[:1, :4].half()).float()], [x]) is None  # 4 elements: chance
