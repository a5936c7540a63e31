"""Shared test helpers: build profile/cluster mappings, files and problems from arrays."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import yaml
from typer.testing import CliRunner

from heterps_cli.formats import Cluster, Profile
from heterps_cli.problem import Problem, build_problem

ROOT = Path(__file__).resolve().parents[1]  # the repository
runner = CliRunner()  # the one CLI runner: conftest's `runner` fixture, and the helpers that invoke the CLI
HEAD = [sys.executable, "-m", "heterps_cli"]  # the CLI as a fresh process
# Plans heterps run can train (the zoo's vgg16, a chain), as launch checks: five nodes of two kinds, and one
PLACED = ROOT / "docs/plans/vgg16-aws-fastest.yaml"
PLACED_MAP = ["--map", "l4=cuda", "--map", "v100-16gb=cuda"]
ONE_NODE = ROOT / "docs/plans/vgg16-aws.yaml"
ONE_NODE_MAP = ["--map", "l4=cuda"]
VGG16_TASK = """import torch
from heterps_cli import Task
from heterps_cli.profiling.zoo import vgg16


def task():
    data = torch.utils.data.TensorDataset(torch.randn(16, 3, 32, 32), torch.arange(16) % 10)
    return Task(model=vgg16(2)[0], data=data, loss=torch.nn.CrossEntropyLoss())
"""  # a task of PLACED's model


def heterps(*args: str, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    """``heterps ARGS`` in a fresh process (``env`` added to this one's), its output captured."""
    return subprocess.run(
        [*HEAD, *args], capture_output=True, text=True, timeout=timeout, check=False, env={**os.environ, **(env or {})}
    )


def instance_dicts(
    oct_, odt, alpha, beta, runnable, prices, limits, B0=32, samples=1e6, min_throughput=0.0, hardware=None
):
    """Profile and cluster mappings; ``hardware`` (from :func:`random_hardware`) adds spec section 1b's fields."""
    n, T = oct_.shape
    types = [f"r{t}" for t in range(T)]
    layers = []
    for layer in range(n):
        times = {
            types[t]: {
                "oct": float(oct_[layer, t]),
                "odt": float(odt[layer, t]),
                "alpha": float(alpha[layer, t]),
                "beta": float(beta[layer, t]),
            }
            for t in range(T)
            if runnable[layer, t]
        }
        entry = {"name": f"l{layer}", "type": "fc", "input_size": 4.0, "weight_size": 4.0, "times": times}
        if hardware is not None:
            entry["input_size"] = float(hardware["input_size"][layer])
            entry["weight_size"] = float(hardware["weight_size"][layer])
            entry["activation_size"] = float(hardware["activation_size"][layer])
            if hardware.get("input_saved") is not None:
                entry["input_saved"] = float(hardware["input_saved"][layer])
            if hardware.get("cast_size") is not None and hardware["cast_size"][layer]:
                entry["cast_size"] = float(hardware["cast_size"][layer])
            entry["sharded"] = bool(hardware["sharded"][layer])
        layers.append(entry)
    profile = {
        "model": "generated",
        "batch_size": int(B0),
        "job": {"samples": float(samples), "epochs": 1.0, "min_throughput": float(min_throughput)},
        "layers": layers,
    }
    cluster = {
        "cluster": "generated",
        "resources": {types[t]: {"price": float(prices[t]), "limit": int(limits[t])} for t in range(T)},
    }
    if hardware is not None:
        profile["state_factor"] = float(hardware["state_factor"])
        for t in range(T):
            for key in ("memory_gb", "bandwidth_gbps"):
                if hardware[key][t] is not None:
                    cluster["resources"][types[t]][key] = float(hardware[key][t])
    return profile, cluster


def random_hardware(rng: np.random.Generator, oct_, B0=32, tightness=None, casts=False):
    """Section 1b fields for a random instance: sizes, sharded layers, and per type a memory that
    binds (needs more replicas, or rules the type out) or not, and a bandwidth that makes the
    boundary transfer matter or not."""
    n, T = oct_.shape
    weight = np.exp(rng.uniform(np.log(1e6), np.log(1e9), n))
    activation = np.where(rng.random(n) < 0.3, 0.0, np.exp(rng.uniform(np.log(1e3), np.log(1e7), n)))
    sharded = rng.random(n) < 0.25
    state_factor = float(rng.choice([1.0, 2.0, 4.0]))
    # With ``casts``, autocast's half-precision copy of a layer's weights on every third layer (no draw
    # from rng, so that the instances are those without it but for these bytes).
    cast_size = np.where((np.arange(n) % 3 == 2) & casts, weight / 2, 0.0)
    # One layer's need with one replica, as the scale a memory is drawn around.
    need = state_factor * weight + cast_size + B0 * activation
    memory = []
    for _ in range(T):
        factor = tightness if tightness is not None else rng.choice([None, 0.3, 0.8, 1.5, 4.0])
        memory.append(None if factor is None else round(float(factor * np.median(need) / 1e9), 6) or 1e-6)
    # Bandwidths where moving a batch's activations costs about as much as a layer's own times.
    input_size = np.exp(rng.uniform(np.log(1e2), np.log(1e6), n))
    typical = 2 * B0 * np.median(input_size) / np.median(oct_) * 8 / 1e9  # Gbit/s for X ~ a layer's OCT
    bandwidth = [
        None if rng.random() < 0.3 else round(float(typical * rng.choice([0.3, 1.0, 3.0])), 6) or 1e-6 for _ in range(T)
    ]
    # What a layer saves of its input that the layer before also saves (a ReLU's output, the next
    # layer's input): half of the smaller of the two on every other layer, without drawing from rng.
    input_saved = np.zeros(n)
    input_saved[1::2] = 0.5 * np.minimum(activation[1::2], activation[:-1:2][: len(activation[1::2])])
    return {
        "input_size": input_size,
        "weight_size": weight,
        "cast_size": cast_size,
        "activation_size": activation,
        "input_saved": input_saved,
        "sharded": sharded,
        "state_factor": state_factor,
        "memory_gb": memory,
        "bandwidth_gbps": bandwidth,
    }


def problem_from_dicts(profile: dict, cluster: dict, **options) -> Problem:
    return build_problem(Profile.model_validate(profile), Cluster.model_validate(cluster), **options)


def write_yaml(path, data) -> str:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def random_instance(rng: np.random.Generator, n: int, T: int, max_limit: int = 5):
    """A random small instance as arrays; every layer runs on at least one type."""
    oct_ = np.exp(rng.uniform(np.log(1e-3), np.log(1.0), (n, T)))
    odt = np.where(rng.random((n, T)) < 0.2, 0.0, np.exp(rng.uniform(np.log(1e-4), np.log(1.0), (n, T))))

    def fraction():
        return np.select([rng.random((n, T)) < 0.15, rng.random((n, T)) < 0.15], [0.0, 1.0], rng.random((n, T)))

    alpha, beta = fraction(), fraction()
    runnable = rng.random((n, T)) < 0.8
    runnable[np.arange(n), rng.integers(0, T, n)] = True
    runnable[rng.integers(0, n, T), np.arange(T)] = True  # every type runs something (none is dropped)
    prices = np.where(rng.random(T) < 0.1, 0.0, rng.uniform(0.01, 5.0, T)).round(4)
    limits = rng.integers(1, max_limit + 1, T)
    return oct_, odt, alpha, beta, runnable, prices, limits


def layers_over_step(model) -> list[float]:
    """Sum of the layers' fastest oct in step order over a whole step's fastest (one thread), after each of
    up to five rounds of 10 runs of both, pooled: another process on the machine (an xdist worker of the
    slow suite) only adds time, so the fastest of the pooled runs is a quiet machine's figure, and the
    layers and the step are measured in turn so that neither gets all the quiet or all the load."""
    import torch

    from heterps_cli.profiling import models, timing

    calls = models.trace(model)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    ratios: list[float] = []
    fastest_layers: list[float] = [float("inf")] * len(calls)
    fastest_step = float("inf")
    try:
        for _ in range(5):
            times = timing.step_order_times(calls, "cpu", 10)  # type: ignore[arg-type]
            fastest_layers = [min(best, *runs) for best, runs in zip(fastest_layers, times, strict=True)]
            fastest_step = min(fastest_step, *timing.step_times(model, "cpu", 10))
            ratios.append(sum(fastest_layers) / fastest_step)
            if 0.75 <= ratios[-1] <= 1.25:
                break
    finally:
        torch.set_num_threads(threads)
    return ratios


def no_traceback(result) -> None:
    """A CLI result that ended as the error model says: no traceback, no exception but an exit."""
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)


def refused(args: list[str], *expected: str, code: int = 2) -> str:
    """Run the CLI on ``args``: it must exit ``code`` without a traceback, saying each of ``expected``
    on standard error (returned)."""
    from heterps_cli.cli.app import app

    result = runner.invoke(app, args)
    no_traceback(result)
    assert result.exit_code == code, result.output
    for text in expected:
        assert text in result.stderr, result.stderr
    return result.stderr


def plan_and_check(profile: str, cluster: str, out: Path, *flags: str, planning: tuple[str, ...] = ()) -> dict:
    """``heterps plan -s exact --objective time`` into ``out``, then ``heterps check`` of it with the
    same job: both must pass; the plan file's mapping. ``planning``: flags of ``plan`` alone."""
    from heterps_cli.cli.app import app

    made = runner.invoke(
        app, ["plan", profile, cluster, "-s", "exact", "--objective", "time", *flags, *planning, "-o", str(out)]
    )
    assert made.exit_code == 0, made.output
    checked = runner.invoke(
        app, ["check", str(out), "--profile", profile, "--cluster", cluster, "--objective", "time", *flags]
    )
    assert checked.exit_code == 0, checked.output
    return yaml.safe_load(out.read_text())


def exact_against(profile: dict, cluster: dict, objective: str, expected, **options):
    """The exact plan (through :func:`heterps_cli.schedulers.solve`, so every choice it makes) checked
    against an enumeration's ``expected`` (cost, throughput): both find a plan or neither, it is
    certified, and its objective's figure is the enumeration's. The plan, or None. ``options``: build_problem's
    (``micro_batch``: the enumeration's own, where it enumerates one)."""
    import math

    from heterps_cli.errors import InfeasibleError
    from heterps_cli.schedulers import solve

    try:
        plan = solve("exact", problem_from_dicts(profile, cluster, objective=objective, **options))
    except InfeasibleError:
        plan = None
    assert (plan is None) == (expected is None), f"exact: {plan and plan.cost_usd}, enumeration: {expected}"
    if plan is None:
        return None
    assert plan.optimal and plan.feasible
    figure, want = (plan.throughput, expected[1]) if objective == "time" else (plan.cost_usd, expected[0])
    assert math.isclose(figure, want, rel_tol=1e-9, abs_tol=1e-12)
    return plan


def guide_commands(page: str, files: list[str], folder: Path) -> list[str]:
    """The commands of a guide page's ``sh`` block, and ``folder`` made to hold what they read: the
    bundled clusters and ``files`` (paths in the repository), at the same relative paths."""
    import re
    import shutil

    text = (ROOT / page).read_text()
    found = re.search(r"```sh\n(.*?)```", text, re.S)
    assert found is not None, f"{page} has no sh block"
    shutil.copytree(ROOT / "clusters", folder / "clusters")
    for name in files:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, folder / name)
    return found.group(1).strip().splitlines()


def profile_cli(args: list[str], expect: int = 0):
    """``heterps profile ARGS`` through the CLI runner: its exit code ``expect``, and no traceback."""
    from heterps_cli.cli.app import app

    result = runner.invoke(app, ["profile", *args])
    assert result.exit_code == expect, result.output
    assert "Traceback" not in result.output
    return result


# -- heterps run's tests: plans of the zoo's mlp, and the processes a run leaves ----------------------

MLP_LAYERS = [str(i) for i in range(7)]  # nn.Sequential: fc, relu, fc, relu, fc, relu, fc


def write_plan(path: Path, stages: list[tuple[str, int, list[str]]], batch_size: int = 64, model: str = "mlp") -> Path:
    """A plan file as heterps plan writes it (the run reads its stages; the figures are the prediction)."""
    rows = [
        {
            "first": MLP_LAYERS.index(layers[0]) if layers[0] in MLP_LAYERS else 0,
            "last": MLP_LAYERS.index(layers[-1]) if layers[-1] in MLP_LAYERS else 0,
            "layers": layers,
            "resource": resource,
            "replicas": replicas,
            "compute_s": 0.01,
            "comm_s": 0.001,
            "throughput": batch_size / 0.01,
        }
        for resource, replicas, layers in stages
    ]
    units: dict[str, int] = {}
    for resource, replicas, _ in stages:
        units[resource] = units.get(resource, 0) + replicas
    plan = {
        "model": model,
        "cluster": "here",
        "objective": "time",
        "scheduler": "exact",
        "seed": 0,
        "batch_size": batch_size,
        "samples": 1000,
        "epochs": 1,
        "min_throughput": 0,
        "stages": rows,
        "resources": units,
        "throughput": batch_size / 0.01,
        "bottleneck": 0,
        "time_s": 1,
        "cost_usd": 1,
        "feasible": True,
        "solve_s": 0,
    }
    path.write_text(json.dumps(plan))
    return path


def run_in_session(argv: list[str], *, env: dict, cwd: str | Path, timeout: float = 240) -> tuple[int, str, str]:
    """``argv`` in a session of its own, waited on; every process it left in that session ended, on success,
    failure and timeout alike: its (exit code, stdout, stderr)."""
    process = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)  # fmt: skip
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    finally:
        for pid in session_processes(process.pid) if os.path.exists("/proc") else []:
            os.kill(pid, signal.SIGKILL)
    return process.returncode, stdout, stderr


def session_processes(session: int) -> list[int]:
    """The processes still alive in ``session`` (Linux /proc)."""
    alive = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == session and fields[0] != "Z":
            alive.append(int(entry.name))
    return alive


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found
