"""heterps as a library: each command's job as one function over files, returning data.

The command line (:mod:`heterps_cli.cli.app`) calls one of these per command and
renders what it returns; a Python caller gets the same objects::

    from heterps_cli import load_problem, solve

    problem = load_problem("profiles/ctr.yaml", "clusters/paper.yaml")
    plan = solve("exact", problem)
    print(plan.cost_usd, [(s.resource, s.replicas) for s in plan.stages])

Bad files raise :class:`~heterps_cli.errors.InputError` (file, line, field);
a problem with no feasible plan raises :class:`~heterps_cli.errors.InfeasibleError`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from heterps_cli.errors import TooLarge
from heterps_cli.formats import Job
from heterps_cli.runtime import run_plan as run  # heterps run, with the runtime's own signature (no torch yet)
from heterps_cli.schedulers import Budget, Progress, SolveOptions, solve, with_what_if

if TYPE_CHECKING:
    from heterps_cli.ci.diff import Change
    from heterps_cli.ci.gate import Finding
    from heterps_cli.compare import Entry
    from heterps_cli.formats import Cluster, Plan, Profile
    from heterps_cli.frontier import Frontier
    from heterps_cli.problem import Problem
    from heterps_cli.profiling.measure import Profiled
    from heterps_cli.shape import Shape

# Each function imports what it uses when it runs: `heterps validate` loads no numpy, and only
# `measure` loads torch (start-up time is measured in benchmarks/bench_startup.py).

__all__ = [
    "Job",
    "Comparison",
    "PlanDiff",
    "plan",
    "frontier",
    "compare",
    "check",
    "diff",
    "validate",
    "Validated",
    "measure",
    "merge",
    "run",
]


def _problem(job: Job, profile_path: str, cluster_path: str) -> Problem:
    """The problem the job makes of the two files (:func:`heterps_cli.problem.load_problem`)."""
    from heterps_cli.problem import load_problem

    return load_problem(profile_path, cluster_path, **dataclasses.asdict(job))


def plan(
    profile_path: str,
    cluster_path: str,
    scheduler: str = "rl",
    job: Job = Job(),
    *,
    seed: int = 0,
    options: SolveOptions | None = None,
    progress: Progress | None = None,
    explain: bool = False,
    shape: Shape | None = None,
    engine: str | None = None,
) -> Plan:
    """``heterps plan``: the plan ``scheduler`` finds for the job on these files; with ``explain``, also
    what one node more or fewer of each kind would give (a cluster with nodes, docs/spec.md section
    1e), or one unit more or fewer of each type's limit. ``shape`` (section 1k): only plans keeping it,
    by the exact solver; ``engine``: the best plan that engine runs (:mod:`heterps_cli.engines`)."""
    from heterps_cli.explain import split_notes

    problem = _problem(job, profile_path, cluster_path)
    if engine is not None or (shape is not None and not shape.free):
        from heterps_cli.shape import Shape

        shape = shape or Shape()
        found = _shaped(problem, shape, engine, seed, progress, options, explain)
        explain = False  # the engine's notes say what binds; what a unit more gives is the free plan's question
    else:
        try:
            found = solve(scheduler, problem, seed=seed, progress=progress, options=options)
        except TooLarge as exc:
            if scheduler != "exact" or exc.field != "exact scheduler":
                raise
            found = _beyond_exact(problem, seed, progress, options, exc)
    if said := split_notes(problem.at_micro_batch(found.batch_size), found):
        found = found.but(notes=[*found.notes, *said])
    return with_what_if(problem, found) if explain and (problem.nodes is None or found.rental) else found


def _shaped(
    problem: Problem,
    shape: Shape,
    engine: str | None,
    seed: int,
    progress: Progress | None,
    options: SolveOptions | None,
    explain: bool,
) -> Plan:
    """Section 1k: the exact plan keeping ``shape``, or the best ``engine`` runs within it, beside heterps
    run's best (within the shape alone); the plan is checked to keep both."""
    from heterps_cli.engines import ENGINES, against_free, best_within
    from heterps_cli.errors import InfeasibleError
    from heterps_cli.shape import breaks, constrained

    options = dataclasses.replace(options or SolveOptions(), mixed_stages=False)  # a shape is of one-type stages
    if engine is None:
        found = solve("exact", constrained(problem, shape), seed=seed, progress=progress, options=options)
        found = found.but(notes=[*found.notes, f"shape: {shape.said()} (docs/spec.md section 1k)"])
    else:
        rules = ENGINES[engine]
        found = best_within(problem, rules, shape, seed=seed, progress=progress, options=options)
        try:
            free = solve("exact", constrained(problem, shape), seed=seed, options=options)
        except InfeasibleError:
            free = None
        found = found.but(notes=[*found.notes, *against_free(found, free, rules, problem.objective, explain)])
    assert not breaks(found, shape, problem.layer_names), breaks(found, shape, problem.layer_names)
    return found


def frontier(
    profile_path: str,
    cluster_path: str,
    job: Job = Job(),
    *,
    time_limit: float | None = None,
    progress: Progress | None = None,
    mixed_stages: bool | None = False,
    resolution: float = 0.0,
    shape: Shape | None = None,
    engine: str | None = None,
) -> Frontier:
    """``heterps frontier``: every Pareto-optimal plan from the cheapest meeting ``job.min_throughput``
    to the fastest (within ``job.max_cost``); ``job.objective`` plays no part. ``time_limit``
    (seconds) stops the walk where it is, with the frontier exact up to there. ``mixed_stages``: over
    mixed stages too (docs/spec.md section 1i), exact where the DP over them runs; None (the command line's
    default): only there. ``resolution`` > 0:
    for every plan, one at most that fraction slower and dearer, rather than every Pareto-optimal plan
    (docs/spec.md section 1c). ``engine``: the frontier of the plans that engine runs; ``shape``: of the
    plans keeping it (section 1k)."""
    from heterps_cli.frontier import engine_frontier, pareto_frontier

    problem = _problem(job, profile_path, cluster_path)
    if engine is not None:
        return engine_frontier(problem, engine, shape, progress=progress, time_limit=time_limit, resolution=resolution)
    if shape is not None and not shape.free:
        from heterps_cli.shape import constrained

        problem = constrained(problem, shape)
        mixed_stages = bool(mixed_stages)  # a shape is of one-type stages
    if mixed_stages is None:
        from heterps_cli.schedulers.mixing import proven_over_mixed

        mixed_stages = proven_over_mixed(problem)
    return pareto_frontier(
        problem, progress=progress, time_limit=time_limit, mixed_stages=mixed_stages, resolution=resolution
    )


@dataclass(frozen=True)
class Comparison:
    problem: Problem
    seed: int
    entries: list[Entry] = field(
        default_factory=list
    )  # in the order the schedulers were asked for, gaps to exact filled in
    frontier: Frontier | None = None  # the exact cost-throughput frontier, when asked for and there is one

    def to_dict(self) -> dict:
        return {
            "model": self.problem.model,
            "cluster": self.problem.cluster,
            "objective": str(self.problem.objective),
            "seed": self.seed,
            "results": [e.to_dict() for e in self.entries],
        }


def _frontier_mixes(problem: Problem, budget: Budget) -> bool:
    """Whether compare's frontier is over mixed stages: where asked, and by default where the exact DP over
    them runs, as frontier's default (past it its points would be climbed, not proven)."""
    if budget.mixed_stages is not None:
        return budget.mixed_stages
    from heterps_cli.schedulers.mixing import proven_over_mixed

    return proven_over_mixed(problem)


def compare(
    profile_path: str,
    cluster_path: str,
    schedulers: list[str],
    job: Job = Job(),
    *,
    seed: int = 0,
    budget: Budget = Budget(),
    progress: Progress | None = None,
    on_done: Callable[[Entry], None] | None = None,
    with_frontier: bool = False,
) -> Comparison:
    """``heterps compare``: every scheduler on one problem with one budget and seed (and, with
    ``with_frontier``, the frontier their plans sit on)."""
    from heterps_cli.compare import compare_schedulers
    from heterps_cli.errors import InfeasibleError, TooLarge
    from heterps_cli.frontier import pareto_frontier

    problem = _problem(job, profile_path, cluster_path)
    entries = compare_schedulers(problem, schedulers, seed=seed, budget=budget, progress=progress, on_done=on_done)
    curve = None
    if with_frontier:
        try:
            curve = pareto_frontier(problem, progress=progress, mixed_stages=_frontier_mixes(problem, budget))
        except TooLarge:  # no exact frontier over mixed stages here: the one-type frontier
            curve = pareto_frontier(problem, progress=progress)
        except InfeasibleError:  # every scheduler's row already says why
            curve = None
    return Comparison(problem, seed, entries, curve)


def check(
    plan_path: str,
    profile_path: str,
    cluster_path: str,
    job: Job = Job(),
    *,
    baseline_path: str | None = None,
    max_increase: str = "0%",
    replan: str | None = None,
    tolerance: str = "1%",
    seed: int = 0,
    progress: Progress | None = None,
    engine: str | None = None,
) -> list[Finding]:
    """``heterps check``: the findings of every gate on a committed plan (all ``ok``: it still holds).

    ``job.max_cost`` and ``job.min_throughput``, when given, are also gates the plan must meet; ``engine``
    (section 1k): the plan must keep that engine's rules, and ``replan`` (exact) finds the best it runs."""
    from heterps_cli.ci.gate import Gate, Increase, gate, percent
    from heterps_cli.loading import load_plan

    committed, _ = load_plan(plan_path)
    baseline = load_plan(baseline_path)[0] if baseline_path is not None else None
    increase = Increase.parse(max_increase)
    # The job is what the profile and the caller say, as for `plan`; the plan's own settings are
    # checked against it (the "job" gate), never used in its place.
    problem = _problem(job, profile_path, cluster_path)
    return gate(
        Gate(
            problem,
            committed,
            plan_path,
            profile_path,
            cluster_path,
            max_cost=job.max_cost,
            min_throughput=job.min_throughput,
            baseline=baseline,
            baseline_path=str(baseline_path),
            max_increase=increase,
            replan=replan,
            tolerance=percent(tolerance, "tolerance"),
            seed=seed,
            engine=engine,
        ),
        progress,
    )


@dataclass(frozen=True)
class PlanDiff:
    changes: list[Change]
    warnings: list[str]  # why the two plans answer different questions (empty when they are comparable)


def diff(old_path: str, new_path: str) -> PlanDiff:
    """``heterps diff``: two plan files side by side."""
    from heterps_cli.ci.diff import diff_plans, incomparable
    from heterps_cli.loading import load_plan

    old, _ = load_plan(old_path)
    new, _ = load_plan(new_path)
    return PlanDiff(diff_plans(old, new), incomparable(old, new))


@dataclass(frozen=True)
class Validated:
    """What ``heterps validate`` read: ``kind`` is profile, cluster or plan, ``found`` its contents,
    and ``cluster`` the cluster a profile was checked against (None without one)."""

    kind: str
    found: Profile | Cluster | Plan
    cluster: Cluster | None = None


def _beyond_exact(problem, seed: int, progress, options, exc: TooLarge) -> Plan:
    """A problem too large for the exact solver's tables is answered, not refused (issue 63): the greedy
    search's plan with its proven gap to :func:`~heterps_cli.bounds.bound`, and why exact could not."""
    from heterps_cli.bounds import by_micro_batch, proven

    given = options or SolveOptions()  # exact's own fields are for exact: greedy reads the time limit alone
    asked = SolveOptions(given.time_limit, given.started, whole_limit=given.whole_limit)
    plan = solve("greedy", problem, seed=seed, progress=progress, options=asked)
    said = f"the exact solver cannot hold this problem ({exc.message.split(';')[0]}): this is the greedy search's plan"
    if (found := proven(problem, plan)) is None:
        return plan.but(notes=[said, *plan.notes])
    gap, words = found
    by = "by each layer's least work per sample on the units the cluster has"
    if by_micro_batch(problem):
        by += " and what each micro-batch's replicas can pass"
    note = f"{said}; {by}, {words} (--scheduler rl may find a better plan)"
    return plan.but(notes=[note, *plan.notes], gap=gap, optimal=False)


def validate(path: str, cluster_path: str | None = None) -> Validated:
    """``heterps validate``: a profile, a cluster or a plan alone, checked against its format; or a
    profile or a plan and a cluster, checked against each other too."""
    from heterps_cli.loading import check_pair, check_plan_on_cluster, check_plannable, load_any, load_with_cluster

    if cluster_path is None:
        kind, found, doc = load_any(path)
        if kind == "profile":
            check_plannable(cast("Profile", found), doc)
        if kind == "cluster":
            from heterps_cli.problem import unrentable

            if (too_many := unrentable(cast("Cluster", found))) is not None:
                raise doc.error(("nodes",), too_many)
        return Validated(kind, found)
    kind, found, doc, cluster, cdoc = load_with_cluster(path, cluster_path)
    if kind == "plan":  # the types, units and nodes it names are the cluster's
        check_plan_on_cluster(cast("Plan", found), doc, cluster, cdoc)
    else:
        check_pair(cast("Profile", found), doc, cluster, cdoc)
    return Validated(kind, found, cluster)


def measure(
    model: str,
    resource: str,
    batch_size: int,
    *,
    device: str = "cpu",
    input_shape: tuple[int, ...] | None = None,
    repetitions: int = 20,
    link_gbps: float | None = None,
    processes: int = 1,
    granularity: str = "auto",
    concurrent: int | None = None,
    progress: Progress | None = None,
    loss: str = "mse",
    optimizer: str = "sgd",
    precision: str | None = None,
    tp: tuple[int, ...] = (),
) -> Profiled:
    """``heterps profile``: measure a PyTorch model's layers here as ``resource``
    (:class:`~heterps_cli.profiling.measure.Profiled`; imports torch), the last layer's with ``loss``
    (:data:`~heterps_cli.runtime.synthetic.LOSSES`), each layer's update with ``optimizer``, at ``precision``
    (:mod:`~heterps_cli.profiling.precision`; None: as the model is, and the profile says none), and at
    each tensor-parallel degree of ``tp`` (:mod:`~heterps_cli.profiling.tensor_parallel`)."""
    from heterps_cli.loading import check_name
    from heterps_cli.profiling.measure import load_model
    from heterps_cli.profiling.measure import measure as measure_model
    from heterps_cli.profiling.precision import check_precision
    from heterps_cli.profiling.processes import measure_in_processes
    from heterps_cli.profiling.tensor_parallel import check_degrees, with_degrees

    resource = check_name(resource, "--as")
    check_precision(precision, device)  # before the model loads
    check_degrees(tp, device)
    if progress is not None:
        progress(f"loading {model}")
    loaded = load_model(model, batch_size, input_shape, granularity)  # here too: its errors name the user's lines
    timing: dict[str, Any] = {"device": device, "repetitions": repetitions, "loss": loss, "precision": precision}
    if processes == 1 and concurrent is None:
        measured = measure_model(
            loaded, resource, link_gbps=link_gbps, progress=progress, optimizer=optimizer, **timing
        )
    else:
        measured = measure_in_processes(
            model,
            batch_size,
            input_shape,
            resource,
            link_gbps=link_gbps,
            processes=processes,
            granularity=granularity,
            concurrent=concurrent,
            progress=progress,
            optimizer=optimizer,
            **timing,
        )
    shape = list(input_shape) if input_shape else None
    args = {"spec": model, "batch_size": batch_size, "input_shape": shape, "granularity": granularity, **timing}
    return with_degrees(measured, loaded, args, tp, progress)


def estimate(
    model: str,
    resource: str,
    batch_size: int,
    device: str,
    *,
    input_shape: tuple[int, ...] | None = None,
    catalogue: str | None = None,
    calibrate: str | None = None,
    calibrate_on: str | None = None,
    tp: tuple[int, ...] = (),
    precision: str = "fp32",
    loss: str = "mse",
    optimizer: str = "sgd",
    granularity: str = "auto",
    progress: Progress | None = None,
):
    """``heterps profile --estimate``: an estimate of the model's layers on catalogue device ``device``,
    operator by operator (:class:`~heterps_cli.profiling.estimate.Estimated`; imports torch)."""
    from heterps_cli.loading import check_name
    from heterps_cli.profiling.estimate import estimate_spec

    resource = check_name(resource, "--as")
    if progress is not None:
        progress(f"loading {model}")
    return estimate_spec(
        model,
        batch_size,
        input_shape,
        granularity,
        resource,
        device,
        catalogue_path=catalogue,
        calibrate=calibrate,
        calibrate_on=calibrate_on,
        tp=tp,
        precision=precision,
        loss=loss,
        optimizer=optimizer,
        progress=progress,
    )


def measure_sizes(model: str, resource: str, sizes: tuple[int, ...], **options) -> tuple[str, Profiled]:
    """``heterps profile --batch-sizes``: :func:`measure` at each size, as one profile's YAML text
    (docs/spec.md section 1f), and the measurement at the largest size."""
    from heterps_cli.profiling.write import measured_text

    progress = options.pop("progress", None)
    return _at_each_size(
        sizes, lambda size, report: measure(model, resource, size, **options, progress=report), measured_text, progress
    )


def estimate_sizes(model: str, resource: str, sizes: tuple[int, ...], device: str, **options) -> tuple[str, Any]:
    """``heterps profile --estimate --batch-sizes``: :func:`estimate` at each size, as one profile's YAML
    text (docs/spec.md section 1f), and the estimate at the largest size."""
    from heterps_cli.profiling.write import estimated_text

    progress = options.pop("progress", None)
    return _at_each_size(
        sizes,
        lambda size, report: estimate(model, resource, size, device, **options, progress=report),
        estimated_text,
        progress,
    )


def _at_each_size(sizes, profile_at, render, progress):
    """Profile at each size (progress naming it), render each, and join them (:func:`at_sizes`)."""
    texts, profiled = {}, None
    for i, size in enumerate(sizes):
        report = progress
        if progress is not None and len(sizes) > 1:

            def report(description, completed=None, total=None, size=size, i=i):
                progress(f"batch {size} ({i + 1} of {len(sizes)}): {description}", completed, total)

        profiled = profile_at(size, report)
        texts[size] = render(profiled)
    return at_sizes(texts), profiled


def at_sizes(texts: dict[int, str]) -> str:
    """One profile (YAML text) from the profile texts of one model at each batch size: the text itself
    for one size, else a merge of them (docs/spec.md section 1f)."""
    if len(texts) == 1:
        return next(iter(texts.values()))
    import tempfile
    from pathlib import Path

    from heterps_cli.profiling.write import merge_profiles

    with tempfile.TemporaryDirectory(prefix="heterps-sizes-") as tmp:
        paths = []
        for size, text in texts.items():
            path = Path(tmp) / f"batch-{size}.yaml"
            path.write_text(text, encoding="utf-8")
            paths.append(str(path))
        return merge_profiles(paths, said=[f"batch {size}" for size in texts])


def merge(profile_paths: list[str]) -> str:
    """``heterps profile merge``: one multi-type profile (YAML text) from profiles of one model
    measured as different types."""
    from heterps_cli.profiling.write import merge_profiles

    return merge_profiles(profile_paths)
