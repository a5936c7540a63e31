"""``heterps plan --engine`` (docs/spec.md section 1k): the best plan an engine runs is the enumeration
oracle's best among the plans keeping the engine's rules; the CLI refuses what it cannot plan; the
torchtitan and DeepSpeed exports hold the plan in those engines' own keys, read back by their own
parsers where they install (skipped, saying why, where they do not)."""

from __future__ import annotations

import json
import math
import tomllib

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from heterps_cli.cli.app import app
from heterps_cli.engines import ENGINES, best_within
from heterps_cli.errors import InfeasibleError
from heterps_cli.shape import Shape
from tests.helpers import problem_from_dicts
from tests.oracle import pipeline_optimum
from tests.strategies import SETTINGS
from tests.test_tensor_parallel import sharded

runner = CliRunner()
PROFILE, CLUSTER = "profiles/transformer.yaml", "clusters/paper.yaml"


def engine_keeps(rules, B0: int):
    def keep(stages, ks, ds, again) -> bool:
        if rules.one_degree and len(set(ds)) > 1 or not rules.tp and any(d > 1 for d in ds):
            return False
        if rules.one_replicas and (len(set(ks)) > 1 or B0 % ks[0]) or not rules.replicas and any(k > 1 for k in ks):
            return False
        if rules.one_recompute and len(set(again)) > 1 or not rules.recompute and any(again):
            return False
        return True

    return keep


@settings(**{**SETTINGS, "max_examples": 40})
@given(st.data())
def test_an_engines_best_plan_is_the_best_plan_keeping_its_rules(data):
    profile, cluster = data.draw(sharded())
    objective = data.draw(st.sampled_from(["cost", "time"]))
    rules = ENGINES[data.draw(st.sampled_from(sorted(ENGINES)))]
    problem = problem_from_dicts(profile, cluster, objective=objective, micro_batch=profile["batch_size"])
    keep = engine_keeps(rules, profile["batch_size"])
    expected = pipeline_optimum(profile, cluster, objective, profile["job"]["min_throughput"], keep=keep)
    try:
        plan = best_within(problem, rules, Shape())
    except InfeasibleError:
        plan = None
    assert (plan is None) == (expected is None), f"engine: {plan and plan.cost_usd}, enumeration: {expected}"
    if plan is None:
        return
    figure, want = (plan.throughput, expected[1]) if objective == "time" else (plan.cost_usd, expected[0])
    assert math.isclose(figure, want, rel_tol=1e-9, abs_tol=1e-12)
    assert plan.optimal


def _engine_plan(tmp_path, engine: str) -> tuple[str, dict]:
    out = tmp_path / f"{engine}.yaml"
    made = runner.invoke(app, ["plan", PROFILE, CLUSTER, "--engine", engine, "--explain", "-o", str(out)])
    assert made.exit_code == 0, made.output
    return str(out), yaml.safe_load(out.read_text())


def test_the_free_plan_breaks_the_rules_and_the_engine_plan_keeps_them(tmp_path):
    free = tmp_path / "free.yaml"
    assert runner.invoke(app, ["plan", PROFILE, CLUSTER, "-s", "exact", "-o", str(free)]).exit_code == 0
    refused = runner.invoke(app, ["export", str(free), "--to", "deepspeed"])
    assert refused.exit_code == 2
    assert "stage 1 has 3 replicas" in refused.output and "--engine deepspeed" in refused.output
    path, plan = _engine_plan(tmp_path, "deepspeed")
    assert len({s["replicas"] for s in plan["stages"]}) == 1
    notes = " ".join(plan["notes"])
    assert "--engine deepspeed: the best plan DeepSpeed runs" in notes and "heterps run's best" in notes
    assert runner.invoke(app, ["export", path, "--to", "deepspeed"]).exit_code == 0


def test_torchtitan_config_holds_the_plan_in_its_own_keys(tmp_path):
    path, plan = _engine_plan(tmp_path, "torchtitan")
    made = runner.invoke(app, ["export", path, "--to", "torchtitan", "-o", str(tmp_path / "job.toml")])
    assert made.exit_code == 0, made.output
    toml = tomllib.loads((tmp_path / "job.toml").read_text())
    par, train = toml["parallelism"], toml["training"]
    stages = plan["stages"]
    M = plan.get("micro_batches") or 1
    assert [name for part in par["module_fqns_per_model_part"] for name in part] == [
        n for s in stages for n in s["layers"]
    ]
    assert par["pipeline_parallel_degree"] == len(stages)
    assert par["data_parallel_replicate_degree"] == stages[0]["replicas"]
    assert train["global_batch_size"] == train["local_batch_size"] * par["data_parallel_replicate_degree"]
    assert train["local_batch_size"] % par["pipeline_parallel_microbatch_size"] == 0
    assert par["pipeline_parallel_microbatch_size"] * stages[0]["replicas"] == plan["batch_size"]
    assert toml["activation_checkpoint"]["mode"] == "none"
    config = pytest.importorskip("torchtitan.config", reason="torchtitan does not install here (it needs triton)")
    job = config.ConfigManager().parse_args(["--job.config_file", str(tmp_path / "job.toml")])
    assert job.parallelism.module_fqns_per_model_part == par["module_fqns_per_model_part"]
    assert job.parallelism.pipeline_parallel_degree == len(stages)
    assert job.training.global_batch_size == plan["batch_size"] * M or M == 1


def test_deepspeed_config_holds_the_plan_in_its_own_keys(tmp_path, monkeypatch):
    path, plan = _engine_plan(tmp_path, "deepspeed")
    made = runner.invoke(app, ["export", path, "--to", "deepspeed"])
    assert made.exit_code == 0, made.output
    config = json.loads(made.output)
    stages, pipe = plan["stages"], config["pipeline"]
    replicas = stages[0]["replicas"]
    assert pipe["parts"][0] == 0 and pipe["parts"][-1] == sum(len(s["layers"]) for s in stages)
    assert [b - a for a, b in zip(pipe["parts"], pipe["parts"][1:])] == [len(s["layers"]) for s in stages]
    micro, steps = config["train_micro_batch_size_per_gpu"], config["gradient_accumulation_steps"]
    assert config["train_batch_size"] == micro * steps * replicas
    assert micro * replicas == plan["batch_size"]
    ds = pytest.importorskip("deepspeed.runtime.config", reason="DeepSpeed does not install here")

    class DataParallel:  # DeepSpeed's model-parallel unit, as a launch with these replicas gives it
        def get_data_parallel_world_size(self):
            return replicas

    monkeypatch.setattr(ds.dist, "get_rank", lambda *a, **k: 0)
    read = ds.DeepSpeedConfig(config, mpu=DataParallel())
    assert (read.train_batch_size, read.train_micro_batch_size_per_gpu) == (config["train_batch_size"], micro)
    assert read.gradient_accumulation_steps == steps and read.pipeline["parts"] == pipe["parts"]


@pytest.mark.parametrize(
    "flags, field",
    [
        (["-s", "greedy", "--engine", "megatron"], "--scheduler"),
        (["--stages", "2"], "--stages"),
        (["--layer-type", "0..nope=v100"], "--layer-type"),
        (["--layer-type", "0..3=h100"], "--layer-type"),
        (["--tp", "2"], "--tp"),
        (["--tp", "1", "--max-tp", "1"], "--max-tp"),
        (["--layer-type", "0..9=cpu", "--layer-type", "3=v100"], "--layer-type"),
        (["--engine", "megatron", "--mixed-stages"], "--mixed-stages"),
    ],
)
def test_shapes_it_cannot_plan_are_refused_naming_the_option(flags, field):
    result = runner.invoke(app, ["plan", PROFILE, CLUSTER, *flags])
    assert result.exit_code == 2, result.output
    assert field in result.output and "Traceback" not in result.output


def test_check_fails_a_plan_the_engine_cannot_run_and_passes_its_best(tmp_path):
    free = tmp_path / "free.yaml"
    assert runner.invoke(app, ["plan", PROFILE, CLUSTER, "-s", "exact", "-o", str(free)]).exit_code == 0
    flags = ["--profile", PROFILE, "--cluster", CLUSTER, "--engine", "megatron"]
    failed = runner.invoke(app, ["check", str(free), *flags, "--format", "json"])
    assert failed.exit_code == 1, failed.output
    engine = next(f for f in json.loads(failed.output)["findings"] if f["gate"] == "engine")
    assert engine["status"] == "fail" and "stage 1 has 3 replicas" in engine["message"]
    assert "--engine megatron" in engine["fix"] and "--scheduler exact" in engine["fix"]
    path, _ = _engine_plan(tmp_path, "megatron")
    passed = runner.invoke(app, ["check", path, *flags, "--replan", "exact"])
    assert passed.exit_code == 0, passed.output
    refused = runner.invoke(app, ["check", path, *flags, "--replan", "greedy"])
    assert refused.exit_code == 2 and "--replan exact" in refused.output


def test_the_engines_frontier_holds_its_cheapest_plan_at_each_throughput():
    made = runner.invoke(app, ["frontier", PROFILE, CLUSTER, "--engine", "deepspeed", "--json"])
    assert made.exit_code == 0, made.output
    plans = json.loads(made.output)["plans"]
    assert len(plans) >= 2
    for point in plans[:: max(1, len(plans) // 3)]:
        assert len({s["replicas"] for s in point["stages"]}) == 1
        floor = ["--min-throughput", repr(point["throughput"] * (1 - 1e-9))]
        best = runner.invoke(app, ["plan", PROFILE, CLUSTER, "--engine", "deepspeed", *floor, "--json"])
        assert best.exit_code == 0, best.output
        assert math.isclose(json.loads(best.output)["cost_usd"], point["cost_usd"], rel_tol=1e-9)


@pytest.mark.slow  # estimates two profiles and plans for three engines: about 5 s
def test_the_engines_pages_journey_runs_in_order_and_each_file_reads_back(tmp_path, monkeypatch):
    import re
    import shlex
    import shutil
    from pathlib import Path

    from tests.test_export_megatron import expand, megatron_parser

    root = Path(__file__).resolve().parents[1]
    page = (root / "docs/guide/engines.md").read_text().split("## The journey", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", page, flags=re.S)
    lines = [line for block in blocks for line in block.splitlines() if line.strip()]
    shutil.copytree(root / "clusters", tmp_path / "clusters")
    monkeypatch.chdir(tmp_path)
    written: list[str] = []
    for line in lines:
        if not line.startswith("heterps "):  # the engine's own command: it takes the file just written
            assert written[-1] in line, line
            continue
        words = shlex.split(line)
        result = runner.invoke(app, words[1:])
        assert result.exit_code == 0, f"{line}\n{result.output}"
        written.append(words[words.index("-o") + 1])
    engines = {w.split("-", 1)[1].removesuffix(".yaml"): w for w in written if w.startswith("plan-")}
    assert sorted(engines) == ["deepspeed", "megatron", "torchtitan"]
    for path in engines.values():
        plan = yaml.safe_load(Path(path).read_text())
        assert "heterps run's best" in " ".join(plan["notes"]) and len({s["replicas"] for s in plan["stages"]}) == 1
    args_text = [x.removesuffix("\\") for x in Path("megatron-args.txt").read_text().splitlines() if x[:1] != "#"]
    args = megatron_parser().parse_args(shlex.split(" ".join(args_text)))
    symbols = expand(args.pipeline_model_parallel_layout)
    assert len(symbols) == args.pipeline_model_parallel_size and sum(s.count("t") for s in symbols) == args.num_layers
    assert tomllib.loads(Path("job.toml").read_text())["parallelism"]["module_fqns_per_model_part"]
    assert json.loads(Path("ds_config.json").read_text())["pipeline"]["parts"][0] == 0


def test_torchtitan_refuses_an_fp16_plan_naming_the_precision(tmp_path):
    path, plan = _engine_plan(tmp_path, "torchtitan")
    plan["precision"] = "fp16"
    (tmp_path / "fp16.yaml").write_text(yaml.safe_dump(plan))
    result = runner.invoke(app, ["export", str(tmp_path / "fp16.yaml"), "--to", "torchtitan"])
    said = " ".join(result.output.split())
    assert result.exit_code == 2 and "precision: the plan trains at fp16" in said and "Traceback" not in said
