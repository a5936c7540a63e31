"""The CI cost gate: recompute a committed plan from the current files and judge it.

:func:`gate` returns findings, one per gate, each passed or failed with one
line saying what, by how much, and what to run to fix it. Failing a gate is
exit 1; a file that cannot be read or validated is exit 2 (an InputError), as
everywhere.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from heterps_cli.ci import diff
from heterps_cli.errors import InfeasibleError, InputError
from heterps_cli.figures import count, exact, number, plural, setting, signed_usd, usd
from heterps_cli.formats import Plan
from heterps_cli.formulas import SLACK, share
from heterps_cli.mixed import joined_of
from heterps_cli.objective import Objective
from heterps_cli.plan import job_fields, make_plan
from heterps_cli.problem import Problem
from heterps_cli.replica_counts import share_floor
from heterps_cli.schedulers import SCHEDULERS, Progress, SolveOptions, solve, with_what_if
from heterps_cli.stages import schedule_of_stages

FIGURE_TOL = 1e-6  # written figures are rounded by no writer of ours; 1e-6 forgives a hand-copied file


@dataclass(frozen=True)
class Finding:
    # fits, job, feasible, fresh, limits, engine, plan-throughput, max-cost, min-throughput, baseline, replan,
    # optimal
    gate: str
    ok: bool
    message: str
    fix: str = ""  # what to run when it failed
    warn: bool = False  # passed, but worth a look (cost rose within the allowance, a cheaper plan within tolerance)
    interrupted: bool = False  # Ctrl-C cut its search short: nothing was judged, and check exits 130

    @property
    def status(self) -> str:
        return "fail" if not self.ok else "warn" if self.warn else "pass"


@dataclass(frozen=True)
class Increase:
    """``--max-increase``: "10%" (of the baseline's cost) or "$25" / "25usd" (dollars). A bare number
    other than 0 is refused: "10" once meant ten dollars to the tool and ten percent to its readers."""

    value: float
    percent: bool

    @classmethod
    def parse(cls, text: str) -> Increase:
        raw = text.strip().lower().replace(" ", "")
        percent = raw.endswith("%")
        dollars = raw.startswith("$") or raw.endswith("usd")
        figure = raw.removesuffix("%").removeprefix("$").removesuffix("usd")
        try:
            value = float(figure)
        except ValueError:
            value = -1.0
        unit = percent != dollars or value == 0  # exactly one unit; 0 needs none
        if not value >= 0 or not math.isfinite(value) or not unit:
            raise InputError(
                None,
                None,
                "max_increase",
                f"expected a percentage of the baseline's cost like 10% or dollars like $25 or 25usd (got {text!r})",
            )
        return cls(value, not dollars)

    def allows(self, old: float, new: float) -> bool:
        limit = old * self.value / 100 if self.percent else self.value
        return new - old <= limit * (1 + FIGURE_TOL) + 1e-12

    def __str__(self) -> str:
        return f"{number(self.value)}%" if self.percent else usd(self.value)


def percent(text: str, field: str) -> float:
    """A percentage as ``--tolerance`` takes it: "1%" (a bare 0 too); a bare other number is refused."""
    raw = text.strip().replace(" ", "")
    try:
        value = float(raw.removesuffix("%"))
    except ValueError:
        value = -1.0
    if not value >= 0 or not math.isfinite(value) or (not raw.endswith("%") and value != 0):
        raise InputError(None, None, field, f"expected a percentage like 1% or 0.5% (got {text!r})")
    return value


def misfits(problem: Problem, plan: Plan) -> list[str]:
    """What of the plan no longer fits the files (empty if all fits)."""
    problems: list[str] = []
    n = problem.n_layers
    expected_first = 0
    for i, stage in enumerate(plan.stages):
        where = f"stage {i}"
        if stage.first != expected_first or stage.last < stage.first:
            problems.append(f"{where} covers layers {stage.first}-{stage.last}, expected to start at {expected_first}")
        expected_first = stage.last + 1
        if stage.resource not in problem.types:
            problems.append(
                f"{where} runs on {stage.resource!r}, which the cluster or profile no longer offers "
                f"(types: {', '.join(problem.types)})"
            )
            continue
        t = problem.types.index(stage.resource)
        names = list(problem.layer_names[stage.first : stage.last + 1])
        if names != list(stage.layers):
            i_diff = next(
                (j for j, (a, b) in enumerate(zip(stage.layers, names)) if a != b), min(len(names), len(stage.layers))
            )
            mine = stage.layers[i_diff] if i_diff < len(stage.layers) else "nothing"
            theirs = names[i_diff] if i_diff < len(names) else "nothing"
            problems.append(f"{where}: layer {stage.first + i_diff} is {mine} in the plan, {theirs} in the profile")
        degree = stage.tp or 1
        if degree not in problem.degrees:
            problems.append(
                f"{where} runs at tp {degree}, which the profile no longer gives under this job (degrees: "
                f"{', '.join(map(str, problem.degrees))}; section 1h needs a pipeline schedule)"
            )
            continue
        view = problem.view_at(degree)
        at = f" at tp {degree}" if degree > 1 else ""
        for layer in range(stage.first, min(stage.last, n - 1) + 1):
            if not view.runnable[layer, t]:
                problems.append(f"layer {problem.layer_names[layer]} cannot run on {stage.resource}{at} any more")
            elif stage.recompute and not (view.can_recompute and view.recomputable[layer, t]):
                problems.append(
                    f"{where} recomputes its activations, but layer {problem.layer_names[layer]} has no forward time "
                    f"on {stage.resource}{at}{'' if problem.pipelined else ' (and the job has no pipeline schedule)'} "
                    "(docs/spec.md section 1g)"
                )
        if stage.joined:
            problems += _joined_misfits(problem, stage, where)
        else:
            problems += _over_measured(problem, plan, i, view, t)
    if expected_first != n:
        problems.append(f"the plan covers {expected_first} layers, the profile has {n}")
    return problems


def _joined_misfits(problem: Problem, stage, where: str) -> list[str]:
    """Section 1i: a mixed stage's joined types, each one the cluster offers that runs every layer; its
    shares, memory and limits are the recomputed plan's feasibility."""
    if not problem.pipelined:
        return [f"{where} mixes types, which heterps plans only under a pipeline schedule (a global batch)"]
    out = []
    for part in stage.joined:
        if part.resource not in problem.types:
            out.append(f"{where} is joined by {part.resource!r}, which the cluster or profile no longer offers")
            continue
        u, degree = problem.types.index(part.resource), part.tp or 1
        if degree not in problem.degrees:
            out.append(f"{part.resource}, which joins {where}, runs at tp {degree}, which the profile no longer gives")
            continue
        view = problem.view_at(degree)
        for layer in range(stage.first, min(stage.last, problem.n_layers - 1) + 1):
            if not view.runnable[layer, u]:
                out.append(
                    f"layer {problem.layer_names[layer]} cannot run on {part.resource}{part.way}, which joins {where}"
                )
    return out


def _over_measured(problem: Problem, plan: Plan, i: int, view: Problem, t: int) -> list[str]:
    """Section 1f: a stage whose replicas each train more samples than its layers were measured at
    (fewer replicas than :func:`~heterps_cli.replica_counts.share_floor` asks)."""
    stage = plan.stages[i]
    if view.share_cap is None or stage.last >= problem.n_layers:
        return []
    layers = slice(stage.first, stage.last + 1)
    needs = int(share_floor(view)[layers, t].max())
    if stage.replicas >= needs:
        return []
    each, cap = int(share(plan.batch_size, stage.replicas)), view.share_cap[layers, t].min()
    return [
        f"stage {i}: each of its {stage.replicas} replicas trains up to {each} samples of the micro-batch of "
        f"{plan.batch_size}, above the {cap:.0f} its layers were measured at on {stage.resource} (docs/spec.md "
        f"section 1f): it needs at least {needs} replicas"
    ]


def at_plans_micro_batch(problem: Problem, plan: Plan) -> tuple[Problem, list[str]]:
    """Section 1f: where the job lets a plan choose its micro-batch, the problem at the plan's (and
    what stops it, if no measured size can give it); else the problem as it is (job_changes then
    compares the micro-batch)."""
    if not problem.choose_micro_batch or plan.batch_size == problem.batch_size:
        return problem, []
    try:
        return problem.at_micro_batch(plan.batch_size), []
    except ValueError as exc:
        return problem, [f"batch_size {plan.batch_size:,}: {exc}"]


def recompute(problem: Problem, plan: Plan) -> tuple[Plan | None, list[str]]:
    """The plan recomputed from ``problem`` (at the plan's micro-batch: :func:`at_plans_micro_batch`),
    or None and what no longer fits."""
    problems = misfits(problem, plan)
    if problems:
        return None, problems
    # In the papers' space consecutive stages on one type would be one stage (docs/spec.md section 1).
    merged = [i for i in range(1, len(plan.stages)) if plan.stages[i].resource == plan.stages[i - 1].resource]
    if merged and problem.maximal_stages:
        return None, [
            f"stages {i - 1} and {i} both run on {plan.stages[i].resource}: with --maximal-stages they are one stage"
            for i in merged
        ]
    if problem.max_cost != plan.max_cost:  # its explanation and feasibility under its own budget; the gate's apart
        problem = problem.replace(max_cost=plan.max_cost)
    schedule = schedule_of_stages(problem, plan.stages)  # each of the plan's stages one of its own
    replicas = [s.replicas for s in plan.stages]
    fresh = make_plan(
        problem,
        schedule,
        replicas,
        scheduler=plan.scheduler,
        seed=plan.seed,
        rental=_still_rentable(problem, plan),
        joined=joined_of(problem, plan.stages),
    )
    if plan.what_if is not None and (problem.nodes is None or fresh.rental is not None):
        fresh = with_what_if(problem, fresh)
    return fresh, []


def _still_rentable(problem: Problem, plan: Plan) -> dict[str, int] | None:
    """Section 1e: the plan's rental, where the cluster still offers it and it holds the plan's units
    (a plan may run on a dearer rental than the cheapest, a single node with links); else None, and
    the plan is recomputed on the rental heterps would choose (which the check then reports)."""
    nodes, rental = problem.nodes, plan.rental
    if nodes is None or not rental or any(kind not in nodes.names for kind in rental):
        return None
    counts = nodes.counts(rental)
    used = np.array([plan.units_of(t) for t in problem.types])
    if (counts > nodes.available).any() or (counts @ nodes.units < used).any():
        return None
    return dict(rental)


def _differs(a: float, b: float) -> bool:
    return not math.isclose(a, b, rel_tol=FIGURE_TOL, abs_tol=1e-12)


def job_changes(plan: Plan, problem: Problem) -> list[str]:
    """Each job setting the plan was made for that the profile, cluster and command line no longer give.

    The gate's truth is those files and flags, never the plan: a plan made for fewer
    samples, a lower required throughput or another objective must not pass for this job.
    """
    now: dict[str, Any] = {k: v for k, v in job_fields(problem).items() if k not in ("max_cost", "micro_batches")}
    if plan.max_cost is not None:  # a budget the plan was made under must still be the budget
        now["max_cost"] = problem.max_cost
    out = []
    for field, value in now.items():
        written = getattr(plan, field)
        same = (
            written == value
            if isinstance(value, str) or value is None or written is None
            else math.isclose(written, value, rel_tol=1e-12, abs_tol=0)
        )
        if not same:
            out.append(f"{field} {setting(written)} in the plan, {setting(value)} now")
    return out


# How a plan was found, not what it is: a plan found by another search or seed still holds.
HOW_FOUND = frozenset({"scheduler", "seed", "evaluations", "solve_s", "notes", "optimal", "gap"})
# The job: job_changes compares these with the files and flags, so they are not stale figures.
JOB_FIELDS = frozenset({*diff.JOB_FIELDS, "batch_size", "precision"})
# Compared below in their own words, or judged by their own gates (feasible: limits, budget, throughput).
OWN_RULES = frozenset({"explanation", "what_if", "feasible", "format"})
NOT_COMPARED = HOW_FOUND | JOB_FIELDS | OWN_RULES  # field by field, written against recomputed


# A field left out that the files give: in a plan that states its format, an edit (its heterps wrote every
# field that applies); in one that does not, an older heterps's omission, compared only for where the plan
# runs (what it rents, where its replicas go), which launch and run place by.
LEFT_OUT = "the plan leaves it out: heterps plan writes it"
PLACEMENT = {"rental": "a plan on a cluster of nodes says what it rents", "nodes": "where its replicas run"}


def stale_fields(written: Plan, fresh: Plan) -> list[str]:
    """Each field the plan file records that the files no longer give, as 'field: written -> recomputed'.

    Every field is compared, at any depth (a stage's figures, each type's memory_gb, the rental),
    except how the plan was found (:data:`HOW_FOUND`) and its job (:func:`job_changes`); one the file
    adds that the recomputation does not give is stale, and so is one it leaves out
    (:func:`left_out`: every such field where the plan states its ``format``, else :data:`PLACEMENT`)."""
    mine, theirs = written.written(), fresh.to_dict()
    out = []
    headline = ("throughput", "time_s", "cost_usd", "bottleneck")  # shown first: the message lists four
    for key in sorted(mine, key=lambda k: headline.index(k) if k in headline else len(headline)):
        if key not in NOT_COMPARED:
            out += _changes(key, mine[key], theirs.get(key))
    missing = left_out(mine, theirs, None if written.format is not None else frozenset(PLACEMENT))
    out += [f"{where} none -> {_shown(value)} ({PLACEMENT.get(key, LEFT_OUT)})" for where, key, value in missing]
    if written.explanation is not None and written.explanation != fresh.explanation:
        out.append("explanation: the files now give another (heterps plan writes it)")
    if written.what_if is not None and not _same_what_if(written.what_if, fresh.what_if):
        out.append("what_if: one node more or fewer now gives other figures (heterps plan --explain writes them)")
    return out


def left_out(mine: dict, theirs: dict, only: frozenset[str] | None = None) -> list[tuple[str, str, Any]]:
    """The fields, the plan's and its stages', that the recomputation gives (``theirs``: its file's mapping)
    and the file leaves out (``mine``), ``only`` those keys where given: where each is, its key, and its
    recomputed value."""

    def missing(where: str, a: dict, b: dict) -> list[tuple[str, str, Any]]:
        keys = sorted(k for k in b.keys() - a.keys() - NOT_COMPARED if b[k] is not None and (only is None or k in only))
        return [(f"{where}{k}", k, b[k]) for k in keys]

    out = missing("", mine, theirs)
    if len(mine["stages"]) == len(theirs["stages"]):
        for i, (a, b) in enumerate(zip(mine["stages"], theirs["stages"])):
            out += missing(f"stages[{i}].", a, b)
    return out


def _changes(where: str, mine: Any, theirs: Any) -> list[str]:
    """Where ``mine`` (a written field) and ``theirs`` (recomputed) differ, as 'where written -> recomputed'."""
    if isinstance(mine, dict) and isinstance(theirs, dict) and mine.keys() == theirs.keys():
        return [c for key in mine for c in _changes(f"{where}.{key}", mine[key], theirs[key])]
    if isinstance(mine, list) and isinstance(theirs, list) and len(mine) == len(theirs):
        if where == "stages":
            return [c for i, (m, t) in enumerate(zip(mine, theirs)) for c in _stage_changes(i, m, t)]
        return [c for i, (m, t) in enumerate(zip(mine, theirs)) for c in _changes(f"{where}[{i}]", m, t)]
    if _same(mine, theirs):
        return []
    return [f"{where} {_shown(mine)} -> {_shown(theirs)}"]


def _stage_changes(i: int, mine: dict, theirs: dict) -> list[str]:
    """The fields a stage writes, against the recomputed stage's (those it leaves out: :func:`left_out`)."""
    return [c for key, value in mine.items() for c in _changes(f"stages[{i}].{key}", value, theirs.get(key))]


def _same(a: Any, b: Any) -> bool:
    numbers = (int, float)
    if isinstance(a, bool) or isinstance(b, bool) or not (isinstance(a, numbers) and isinstance(b, numbers)):
        return a == b
    return not _differs(float(a), float(b))


def _shown(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, float):
        return f"{value:,.6g}"
    return str(value)


def _same_what_if(written, fresh) -> bool:
    if fresh is None or len(written) != len(fresh):
        return False
    for w, f in zip(written, fresh):
        if (w.kind, w.change, w.rental, w.limit, w.meets) != (f.kind, f.change, f.rental, f.limit, f.meets):
            return False
        for name in ("throughput", "cost_usd"):
            a, b = getattr(w, name), getattr(f, name)
            if (a is None) != (b is None) or (a is not None and _differs(a, b)):
                return False
    return True


def plan_command(
    profile: str,
    cluster: str,
    problem: Problem,
    plan: Plan,
    plan_path: str,
    scheduler: str | None = None,
    seed: int = 0,
    engine: str | None = None,
) -> str:
    """The ``heterps plan`` command that plans this job (the files' and flags', not the plan's) into the plan's file.

    Run, it must make a plan that passes the check that suggested it: so every job setting is
    spelled out to its last digit, the objective always (tapp's default differs from the others'),
    and the seed a stochastic search was given. It ends up in pull-request comments, so nothing
    from the plan file is copied into it verbatim: the scheduler must be a known one (else exact),
    and every path is quoted."""
    job = f" --samples {exact(problem.samples)} --epochs {exact(problem.epochs)}"
    if problem.min_throughput > 0:
        job += f" --min-throughput {exact(problem.min_throughput)}"
    if problem.max_cost is not None:
        job += f" --max-cost {exact(problem.max_cost)}"
    if problem.pipelined:
        job += f" --global-batch {problem.step_samples}"
    if _fixed_micro_batch(problem):
        job += f" --micro-batch {problem.batch_size}"
    if problem.maximal_stages:
        job += " --maximal-stages"
    if engine is None:  # section 1i: the plan's own space, as --replan's (plan offers mixed stages by default)
        from heterps_cli.schedulers.mixing import can_mix

        if plan.mixes:
            job += " --mixed-stages"
        elif can_mix(problem) is None:
            job += " --no-mixed-stages"
    name = scheduler or plan.scheduler
    name = name if name in SCHEDULERS and engine is None else "exact"  # plan --engine plans with exact
    if engine is not None:
        job += f" --engine {engine}"
    stochastic = f" --seed {seed}" if seed and name not in ("exact", "greedy") else ""
    explain = " --explain" if plan.what_if is not None else ""  # the refreshed plan keeps its what-if
    return (
        f"heterps plan {shlex.quote(profile)} {shlex.quote(cluster)} --scheduler {name} "
        f"--objective {problem.objective}{job}{stochastic}{explain} --out {shlex.quote(plan_path)}"
    )


def _fixed_micro_batch(problem: Problem) -> bool:
    """Section 1f: whether the job fixes a micro-batch that the profile alone would not give (a
    ``--micro-batch`` among several measured sizes, or at an unmeasured one)."""
    sizes = problem.measured.sizes if problem.measured is not None else (problem.batch_size,)
    return not problem.choose_micro_batch and (len(sizes) > 1 or problem.batch_size not in sizes)


@dataclass(frozen=True)
class Gate:
    """What ``heterps check`` judges: a committed plan against the job the files and flags give.

    ``problem`` is that job (profile, cluster, command line): the plan's own job
    settings are checked against it, never trusted. ``max_cost`` and
    ``min_throughput`` are the flags' explicit bounds (None: not given).
    """

    problem: Problem
    plan: Plan
    plan_path: str
    profile_path: str
    cluster_path: str
    max_cost: float | None = None
    min_throughput: float | None = None
    baseline: Plan | None = None
    baseline_path: str = "BASELINE"
    max_increase: Increase = Increase(0.0, True)
    replan: str | None = None
    tolerance: float = 1.0  # percent
    seed: int = 0
    engine: str | None = None  # section 1k: the plan must keep this engine's rules, and --replan finds its best

    @property
    def replan_command(self) -> str:
        return self.command()

    def replan_fix(self, what: str) -> str:
        """A fix that re-plans: ``what: COMMAND``, unless the budget leaves no plan of the job, when the
        command would fail: then what the cheapest plan costs."""
        return self.short_budget or f"{what}: {self.replan_command}"

    @cached_property
    def short_budget(self) -> str | None:
        """Where ``--max-cost`` rules out every plan of the job (by the exact solver): the budget it needs."""
        from heterps_cli.errors import InfeasibleError, TooLarge
        from heterps_cli.objective import Objective
        from heterps_cli.schedulers import solve

        if self.problem.max_cost is None or _cheapest(self.problem) != "exact":
            return None
        try:
            cheapest = solve("exact", self.problem.replace(objective=Objective.COST, max_cost=None)).cost_usd
        except (InfeasibleError, TooLarge):
            return None
        if cheapest <= self.problem.max_cost * (1 + 1e-12):
            return None
        return (
            f"no plan meets the job within {usd(self.problem.max_cost)}: the cheapest costs {usd(cheapest)} (exact); "
            "raise --max-cost to at least that, or ask less of the job (--min-throughput, --samples, --epochs)"
        )

    def command(self, scheduler: str | None = None) -> str:
        """:func:`plan_command` for this job, with ``scheduler`` (default: the plan's) and the check's seed."""
        return plan_command(
            self.profile_path, self.cluster_path, self.problem, self.plan, self.plan_path, scheduler, self.seed,
            self.engine,
        )  # fmt: skip


def gate(g: Gate, progress: Progress | None = None) -> list[Finding]:
    """Every gate, in order; a plan that no longer fits the files stops after that finding."""
    at, problems = at_plans_micro_batch(g.problem, g.plan)
    fresh, problems = (None, problems) if problems else recompute(at, g.plan)
    if fresh is None:
        return [
            Finding(
                "fits",
                False,
                f"{g.plan_path} no longer fits the profile and cluster: {'; '.join(problems)}",
                g.replan_fix("re-plan"),
            )
        ]
    findings = [
        Finding("fits", True, f"{g.plan_path} fits the profile and cluster ({plural(len(g.plan.stages), 'stage')})"),
        _job(g, at),
    ]
    if not g.plan.feasible:
        findings.append(
            Finding("feasible", False, "the plan file itself says it is infeasible", g.replan_fix("re-plan"))
        )
    stale = stale_fields(g.plan, fresh)
    findings += [_fresh(g, stale, fresh), _limits(g, fresh)]
    if g.engine is not None:
        findings.append(_engine(g))
    findings += [
        f
        for f in (
            _plan_throughput(g, fresh),
            _max_cost(g, fresh),
            _min_throughput(g, fresh),
            _baseline(g, fresh, stale),
        )
        if f is not None
    ]
    if g.replan is not None:
        findings += _replan(g, fresh, progress)
    if g.plan.optimal and not any(f.gate == "optimal" for f in findings):  # a file's word is no proof
        findings.append(
            Finding(
                "optimal",
                True,
                "the plan says it is optimal: not verified here (--replan exact verifies it)",
                warn=True,
            )
        )
    return findings


def _engine(g: Gate) -> Finding:
    """Section 1k: whether the engine runs the plan as it is."""
    from heterps_cli.engines import ENGINES, unfit

    rules = ENGINES[g.engine or ""]
    problems = unfit(g.plan, rules)
    if not problems:
        return Finding("engine", True, f"{rules.title} runs the plan as it is (heterps export --to {rules.name})")
    said = f"{rules.title} cannot run the plan as it is: {'; '.join(problems)}"
    return Finding("engine", False, said, g.replan_fix("plan within its rules"))


def _job(g: Gate, at: Problem) -> Finding:
    """The job gate, against the job at the plan's micro-batch (``at``)."""
    changed = job_changes(g.plan, at)
    if not changed:
        return Finding(
            "job", True, "made for this job (model, cluster, objective, samples, epochs, required throughput)"
        )
    return Finding(
        "job",
        False,
        f"the plan was made for another job than the files and flags give: {'; '.join(changed)}",
        g.short_budget
        or f"re-plan for this job: {g.replan_command}; or, if the plan's job is the one you mean, give check "
        "the flags you gave heterps plan",
    )


def _fresh(g: Gate, stale: list[str], fresh: Plan) -> Finding:
    if not stale:
        unchecked = left_out(g.plan.written(), fresh.to_dict()) if g.plan.format is None else []
        if unchecked:  # an older heterps's plan, or one edited down to look like one
            return Finding(
                "fresh",
                True,
                f"every figure the plan gives matches a recomputation, but it states no format (an older "
                f"heterps's plan) and leaves out {plural(len(unchecked), 'field')} the files give, not compared: "
                f"{', '.join(where for where, _, _ in unchecked[:6])}{' …' if len(unchecked) > 6 else ''}",
                g.replan_fix("refresh it"),
                warn=True,
            )
        return Finding("fresh", True, "every figure in the plan matches a recomputation from the files")
    return Finding(
        "fresh",
        False,
        f"the plan's figures are stale (written -> recomputed): {'; '.join(stale[:4])}{' …' if len(stale) > 4 else ''}",
        g.replan_fix("refresh it"),
    )


def _limits(g: Gate, fresh: Plan) -> Finding:
    limits, units_gb = fresh.limits or {}, fresh.memory_gb or {}  # a recomputed plan has both
    over = [f"{t} {u} > limit {limits[t]}" for t, u in fresh.resources.items() if u > limits[t]]
    for i, s in enumerate(fresh.stages):  # section 1b: every replica must fit its unit's memory
        memory = units_gb.get(s.resource)
        if memory is not None and s.memory_gb is not None and s.memory_gb > memory * (1 + SLACK):
            over.append(
                f"stage {i} needs {s.memory_gb:.3g} GB per replica on {s.resource} (memory {number(memory)} GB)"
            )
    if not over:
        return Finding("limits", True, "within every resource limit" + (" and memory" if _has(units_gb) else ""))
    return Finding(
        "limits",
        False,
        f"resource limits exceeded: {', '.join(over)}",
        g.replan_fix("re-plan within the limits"),
    )


def _has(per_type: dict) -> bool:
    return any(v is not None for v in per_type.values())


def _plan_throughput(g: Gate, fresh: Plan) -> Finding | None:
    """The job's own requirement (the profile's), when no --min-throughput gate replaces it."""
    required = g.problem.min_throughput
    if required <= 0 or g.min_throughput is not None or fresh.throughput >= required * (1 - 1e-12):
        return None
    return Finding(
        "plan-throughput",
        False,
        f"throughput {count(fresh.throughput, 1)} samples/s is under the job's requirement {count(required, 1)}",
        g.replan_fix("re-plan"),
    )


def _max_cost(g: Gate, fresh: Plan) -> Finding | None:
    if g.max_cost is None:
        return None
    ok = fresh.cost_usd <= g.max_cost * (1 + 1e-12)
    by = "" if ok else f" by {usd(fresh.cost_usd - g.max_cost)} ({100 * (fresh.cost_usd / g.max_cost - 1):.1f}%)"
    return Finding(
        "max-cost",
        ok,
        f"cost {usd(fresh.cost_usd)} {'within' if ok else 'exceeds'} the --max-cost {usd(g.max_cost)}{by}",
        ""
        if ok
        else g.short_budget or f"find the cheapest plan: {g.command(_cheapest(g.problem))}, or raise the budget",
    )


def _cheapest(problem: Problem) -> str | None:
    """exact, which finds a plan within the budget whenever one exists (a heuristic may not); the
    plan's own scheduler (None) where the model is too long for exact."""
    from heterps_cli.schedulers.exact.terms import too_large

    return None if too_large(problem) else "exact"


def _min_throughput(g: Gate, fresh: Plan) -> Finding | None:
    if g.min_throughput is None:
        return None
    ok = fresh.throughput >= g.min_throughput * (1 - 1e-12)
    by = "" if ok else f" by {100 * (1 - fresh.throughput / g.min_throughput):.1f}%"
    return Finding(
        "min-throughput",
        ok,
        f"throughput {count(fresh.throughput, 1)} samples/s "
        f"{'meets' if ok else 'is under'} --min-throughput {count(g.min_throughput, 1)}{by}",
        "" if ok else g.replan_fix("re-plan"),
    )


def _baseline(g: Gate, fresh: Plan, stale: list[str]) -> Finding | None:
    if g.baseline is None:
        return None
    old, new = g.baseline.cost_usd, fresh.cost_usd
    ok = g.max_increase.allows(old, new)
    change = signed_usd(new - old) + (f" ({100 * (new / old - 1):+.1f}%)" if old > 0 else "")
    where = f"see where the cost rose: heterps diff {shlex.quote(g.baseline_path)} {shlex.quote(g.plan_path)}"
    if stale:  # the diff reads the written figures, so they must be the recomputed ones first
        where = f"refresh {g.plan_path} ({g.replan_command}), then {where}"
    unlike = diff.incomparable(g.baseline, g.plan)
    caveat = f" (warning: {'; '.join(unlike)})" if unlike else ""
    return Finding(
        "baseline",
        ok,
        f"cost {usd(old)} -> {usd(new)}, {change}; allowed increase {g.max_increase}{caveat}",
        "" if ok else where,
        warn=new > old * (1 + FIGURE_TOL) or bool(unlike),
    )


def _replan(g: Gate, fresh: Plan, progress: Progress | None) -> list[Finding]:
    """Whether the scheduler ``g.replan`` finds a plan better by more than the tolerance (and, for a plan
    that claims to be optimal, whether exact finds any better one)."""
    name, problem = g.replan, g.problem
    assert name is not None
    try:
        if g.engine is not None:  # the best plan the engine runs (section 1k)
            from heterps_cli.engines import ENGINES, best_within
            from heterps_cli.shape import Shape

            better = best_within(problem, ENGINES[g.engine], Shape(), seed=g.seed, progress=progress)
        else:
            options = SolveOptions(mixed_stages=g.plan.mixes)  # the plan's own space
            better = solve(name, problem, seed=g.seed, progress=progress, options=options)
    except InfeasibleError as exc:
        return [Finding("replan", True, f"{name} finds no feasible plan ({exc}); the committed plan stands")]
    if better.interrupted:  # a search cut short proves nothing either way: the gate must not pass
        return [
            Finding(
                "replan",
                False,
                f"{name} was interrupted (Ctrl-C) before it finished, so the plan was not judged against it",
                "run the check again and let it finish",
                interrupted=True,
            )
        ]
    if problem.objective is Objective.TIME:  # the plan's own objective decides what wasteful means
        saving = 1 - fresh.throughput / better.throughput if better.throughput > 0 else 0.0
        found = (
            f"{name} finds {count(better.throughput, 1)} samples/s against the plan's "
            f"{count(fresh.throughput, 1)} ({100 * saving:.1f}% faster; tolerance {number(g.tolerance)}%)"
        )
    else:
        saving = 1 - better.cost_usd / fresh.cost_usd if fresh.cost_usd > 0 else 0.0
        found = (
            f"{name} finds {usd(better.cost_usd)} against the plan's {usd(fresh.cost_usd)} "
            f"({100 * saving:.1f}% cheaper; tolerance {number(g.tolerance)}%)"
        )
    ok = saving <= g.tolerance / 100 + 1e-12
    adopt = f"adopt it: {g.command(name)}"
    findings = [Finding("replan", ok, found, "" if ok else adopt, warn=saving > 1e-9)]
    if g.plan.optimal and name == "exact":  # a claim exact now verifies, whatever the tolerance
        if saving > 1e-9:
            said = f"the plan says it is optimal, but exact finds one {100 * saving:.2g}% better"
            findings.append(Finding("optimal", False, said, adopt))
        elif better.optimal:
            findings.append(Finding("optimal", True, "the plan says it is optimal, and exact proves no plan better"))
    return findings
