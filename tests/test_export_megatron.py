"""heterps export --to megatron: Megatron-LM's arguments for a plan, read back by a parser written from
Megatron-LM's documented flags (its arguments.py and docs/api-guide/pipeline_parallel_layout.md: E the
embedding, t a decoder layer, L the output and loss, stages split by '|', X*n for n of X, commas cosmetic),
which must give back every stage's layers, never rounded; what Megatron cannot express is refused."""

from __future__ import annotations

import argparse
import json
import re
import shlex

import pytest
import yaml

from heterps_cli.cli.app import app
from tests.helpers import runner, write_plan, write_yaml


def megatron_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(exit_on_error=False)
    for flag in ("--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--num-layers",
                 "--micro-batch-size", "--global-batch-size", "--recompute-num-layers"):  # fmt: skip
        parser.add_argument(flag, type=int)
    parser.add_argument("--pipeline-model-parallel-layout", type=str)
    parser.add_argument("--recompute-granularity", choices=["full", "selective"])
    parser.add_argument("--recompute-method", choices=["uniform", "block"])
    for flag in ("--bf16", "--fp16", "--untie-embeddings-and-output-weights"):
        parser.add_argument(flag, action="store_true")
    return parser


def expand(layout: str) -> list[list[str]]:
    """The documented layout notation, each stage's symbols in order."""
    stages = []
    for stage in layout.split("|"):
        symbols: list[str] = []
        for item in filter(None, stage.split(",")):
            for symbol, times in re.findall(r"([EtLm])(?:\*(\d+))?", item):
                symbols += [symbol] * int(times or 1)
        stages.append(symbols)
    return stages


def _files(tmp_path, stages, tp=1, **fields):
    names = [n for _, _, layers in stages for n in layers]
    kinds = ["embed"] + ["block"] * (len(names) - 2) + ["head"]
    times = {"gpu": {"oct": 1.0, "odt": 0.1}}
    rows = [{"name": n, "type": k, "input_size": 1, "weight_size": 1, "alpha": 0.9, "beta": 0.5, "times": times}
            for n, k in zip(names, kinds)]  # fmt: skip
    profile = {"model": "m", "batch_size": 8, "layers": rows}
    plan = write_plan(tmp_path / "plan.json", stages, 8, model="m")
    doc = json.loads(plan.read_text())
    for s in doc["stages"]:
        if tp > 1:
            s["tp"] = tp
    doc.update(fields)
    plan.write_text(json.dumps(doc))
    return plan, write_yaml(tmp_path / "profile.yaml", profile)


def test_an_uneven_split_reads_back_as_the_plans_stages_with_its_degrees_and_batches(tmp_path):
    layers = [str(i) for i in range(10)]
    stages = [("gpu", 2, layers[:4]), ("gpu", 2, layers[4:5]), ("gpu", 2, layers[5:])]
    plan, profile = _files(tmp_path, stages, tp=4, precision="bf16")
    result = runner.invoke(app, ["export", str(plan), "--to", "megatron", "--profile", profile, "--micro-batches",
                                 "6"])  # fmt: skip
    assert result.exit_code == 0, result.output
    lines = [line.removesuffix("\\") for line in result.stdout.splitlines() if not line.startswith("#")]
    args = megatron_parser().parse_args(shlex.split(" ".join(lines)))
    assert (args.tensor_model_parallel_size, args.pipeline_model_parallel_size) == (4, 3)
    assert args.num_layers == 8 and args.micro_batch_size == 4 and args.global_batch_size == 8 * 6
    assert args.bf16 and args.untie_embeddings_and_output_weights  # the profile ties nothing
    symbols = expand(args.pipeline_model_parallel_layout)
    assert symbols == [["E", "t", "t", "t"], ["t"], ["t", "t", "t", "t", "L"]]
    assert sum(s.count("t") for s in symbols) == args.num_layers


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (lambda doc: doc["stages"][1].update(replicas=1), "stage 1 has 1 replicas, stage 0 2"),
        (lambda doc: doc["stages"][1].update(tp=2), "stage 1 runs at tp 2, stage 0 at 1"),
        (lambda doc: doc["stages"][0].update(recompute=True), "stage 1 does not recompute"),
    ],
)
def test_what_megatron_cannot_express_is_refused_naming_it(tmp_path, edit, said):
    plan, profile = _files(tmp_path, [("gpu", 2, ["0", "1"]), ("gpu", 2, ["2", "3"])])
    doc = json.loads(plan.read_text())
    edit(doc)
    plan.write_text(json.dumps(doc))
    result = runner.invoke(app, ["export", str(plan), "--to", "megatron", "--profile", profile])
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and said in text and "Traceback" not in text, result.output


def test_layers_between_the_ends_of_two_kinds_are_refused(tmp_path):
    plan, profile = _files(tmp_path, [("gpu", 1, ["0", "1"]), ("gpu", 1, ["2", "3"])])
    data = yaml.safe_load(open(profile))
    data["layers"][1]["type"] = "conv"
    write_yaml(tmp_path / "profile.yaml", data)
    result = runner.invoke(app, ["export", str(plan), "--to", "megatron", "--profile", profile])
    assert result.exit_code == 2 and "['block', 'conv']" in " ".join(result.output.split())


def test_the_output_is_never_the_profile_it_reads(tmp_path):
    plan, profile = _files(tmp_path, [("gpu", 1, ["0", "1"]), ("gpu", 1, ["2", "3"])])
    before = open(profile).read()
    result = runner.invoke(app, ["export", str(plan), "--to", "megatron", "--profile", profile, "-o", profile])
    assert result.exit_code == 2 and "an input of this command" in " ".join(result.output.split())
    assert open(profile).read() == before
