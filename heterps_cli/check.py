"""The CI cost gate: recompute a committed plan from the current files and judge it; diff two plans.

:func:`check` returns findings, one per gate, each passed or failed with one
line saying what, by how much, and what to run to fix it. Failing a gate is
exit 1; a file that cannot be read or validated is exit 2 (an InputError), as
everywhere.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass

import numpy as np

from heterps_cli.errors import InfeasibleError, InputError
from heterps_cli.figures import count, plural, signed_usd, usd
from heterps_cli.formats import PlanFile
from heterps_cli.plan import Plan, make_plan
from heterps_cli.problem import Problem
from heterps_cli.schedulers import SCHEDULERS, SolveOptions, solve

REL_TOL = 1e-6  # written figures are rounded by no writer of ours; 1e-6 forgives a hand-copied file


@dataclass(frozen=True)
class Finding:
    gate: str  # fits, fresh, limits, plan-throughput, max-cost, min-throughput, baseline, replan
    ok: bool
    message: str
    fix: str = ""  # what to run when it failed
    warn: bool = False  # passed, but worth a look (cost rose within the allowance, a cheaper plan within tolerance)

    @property
    def status(self) -> str:
        return "fail" if not self.ok else "warn" if self.warn else "pass"


@dataclass(frozen=True)
class Increase:
    """``--max-increase``: "10%" (relative) or "25" (USD)."""

    value: float
    percent: bool

    @classmethod
    def parse(cls, text: str) -> "Increase":
        raw = text.strip()
        percent = raw.endswith("%")
        try:
            value = float(raw.rstrip("%").lstrip("$"))
        except ValueError:
            value = -1.0
        if not value >= 0 or not math.isfinite(value):
            raise InputError(None, None, "--max-increase", f"expected a percentage like 10% or dollars like 25 (got {text!r})")
        return cls(value, percent)

    def allows(self, old: float, new: float) -> bool:
        limit = old * self.value / 100 if self.percent else self.value
        return new - old <= limit * (1 + REL_TOL) + 1e-12

    def __str__(self) -> str:
        return f"{self.value:g}%" if self.percent else usd(self.value)


def schedule_of(problem: Problem, plan: PlanFile) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """The plan's type per layer and replicas per stage, and what no longer fits the files (empty if all fits)."""
    problems: list[str] = []
    n = problem.n_layers
    schedule = np.full(n, -1, dtype=np.int64)
    expected_first = 0
    for i, stage in enumerate(plan.stages):
        where = f"stage {i}"
        if stage.first != expected_first or stage.last < stage.first:
            problems.append(f"{where} covers layers {stage.first}-{stage.last}, expected to start at {expected_first}")
        expected_first = stage.last + 1
        if stage.resource not in problem.types:
            problems.append(f"{where} runs on {stage.resource!r}, which the cluster or profile no longer offers "
                            f"(types: {', '.join(problem.types)})")
            continue
        t = problem.types.index(stage.resource)
        names = list(problem.layer_names[stage.first : stage.last + 1])
        if names != list(stage.layers):
            i_diff = next((j for j, (a, b) in enumerate(zip(stage.layers, names)) if a != b), min(len(names), len(stage.layers)))
            mine = stage.layers[i_diff] if i_diff < len(stage.layers) else "nothing"
            theirs = names[i_diff] if i_diff < len(names) else "nothing"
            problems.append(f"{where}: layer {stage.first + i_diff} is {mine} in the plan, {theirs} in the profile")
        for layer in range(stage.first, min(stage.last, n - 1) + 1):
            if not problem.runnable[layer, t]:
                problems.append(f"layer {problem.layer_names[layer]} cannot run on {stage.resource} any more")
            schedule[layer] = t
    if expected_first != n:
        problems.append(f"the plan covers {expected_first} layers, the profile has {n}")
    return schedule, np.array([s.replicas for s in plan.stages], dtype=float), problems


def recompute(problem: Problem, plan: PlanFile) -> tuple[Plan | None, list[str]]:
    schedule, replicas, problems = schedule_of(problem, plan)
    if problems:
        return None, problems
    # Consecutive plan stages on one type would be one stage by SPEC's maximal-run rule.
    merged = [i for i in range(1, len(plan.stages)) if plan.stages[i].resource == plan.stages[i - 1].resource]
    if merged:
        return None, [f"stages {i - 1} and {i} both run on {plan.stages[i].resource}: SPEC makes them one stage"
                      for i in merged]
    return make_plan(problem, schedule, replicas, scheduler=plan.scheduler, seed=plan.seed), []


def _differs(a: float, b: float) -> bool:
    return not math.isclose(a, b, rel_tol=REL_TOL, abs_tol=1e-12)


def _setting(value) -> str:
    """A job setting as a message shows it: 'ctr', none, 1e+09."""
    return repr(value) if isinstance(value, str) else "none" if value is None else f"{value:,g}"


def job_changes(plan: PlanFile, problem: Problem) -> list[str]:
    """Each job setting the plan was made for that the profile, cluster and command line no longer give.

    The gate's truth is those files and flags, never the plan: a plan made for fewer
    samples, a lower required throughput or another objective must not pass for this job.
    """
    now = {"model": problem.model, "cluster": problem.cluster, "objective": problem.objective,
           "batch_size": problem.batch_size, "samples": problem.samples, "epochs": problem.epochs,
           "min_throughput": problem.min_throughput}
    if plan.max_cost is not None:  # a budget the plan was made under must still be the budget
        now["max_cost"] = problem.max_cost
    out = []
    for field, value in now.items():
        written = getattr(plan, field)
        same = written == value if isinstance(value, str) or value is None or written is None \
            else math.isclose(written, value, rel_tol=1e-12, abs_tol=0)
        if not same:
            out.append(f"{field} {_setting(written)} in the plan, {_setting(value)} now")
    return out


def stale_fields(written: PlanFile, fresh: Plan) -> list[str]:
    """Each figure the plan file states that the files no longer give, as 'field: written -> recomputed'."""
    out = []
    for name in ("throughput", "time_s", "cost_usd"):
        if _differs(getattr(written, name), getattr(fresh, name)):
            out.append(f"{name} {getattr(written, name):,.6g} -> {getattr(fresh, name):,.6g}")
    if written.bottleneck != fresh.bottleneck:
        out.append(f"bottleneck {written.bottleneck} -> {fresh.bottleneck}")
    for i, (w, f) in enumerate(zip(written.stages, fresh.stages)):
        for name in ("compute_s", "comm_s", "throughput"):
            if _differs(getattr(w, name), getattr(f, name)):
                out.append(f"stages[{i}].{name} {getattr(w, name):.6g} -> {getattr(f, name):.6g}")
    used = {t: u for t, u in fresh.resources.items() if u}
    if {t: u for t, u in written.resources.items() if u} != used:
        out.append(f"resources {dict(written.resources)} -> {used}")
    return out


def plan_command(profile: str, cluster: str, problem: Problem, plan: PlanFile, plan_path: str,
                 scheduler: str | None = None) -> str:
    """The ``heterps plan`` command that plans this job (the files' and flags', not the plan's) into the plan's file.

    It ends up in pull-request comments, so nothing from the plan file is copied into it
    verbatim: the scheduler must be a known one (else exact), and every path is quoted."""
    job = f" --samples {problem.samples:g} --epochs {problem.epochs:g}"
    if problem.min_throughput > 0:
        job += f" --min-throughput {problem.min_throughput:g}"
    if problem.max_cost is not None:
        job += f" --max-cost {problem.max_cost:g}"
    objective = f" --objective {problem.objective}" if problem.objective != "cost" else ""
    name = scheduler or plan.scheduler
    name = name if name in SCHEDULERS else "exact"
    return (f"heterps plan {shlex.quote(profile)} {shlex.quote(cluster)} --scheduler {name}{objective}{job} "
            f"--out {shlex.quote(plan_path)}")


def check(problem: Problem, plan: PlanFile, plan_path: str, *, profile_path: str, cluster_path: str, max_cost: float | None = None,
          min_throughput: float | None = None, baseline: PlanFile | None = None, baseline_path: str = "BASELINE", max_increase: Increase | None = None,
          replan: str | None = None, tolerance: float = 1.0, seed: int = 0, progress=None) -> list[Finding]:
    """Every gate, in order; a plan that no longer fits the files stops after that finding.

    ``problem`` is the job as the profile, the cluster and the command line give it:
    the plan's own job settings are checked against it, never trusted."""
    replan_command = plan_command(profile_path, cluster_path, problem, plan, plan_path)
    fresh, problems = recompute(problem, plan)
    if fresh is None:
        return [Finding("fits", False, f"{plan_path} no longer fits the profile and cluster: {'; '.join(problems)}",
                        f"re-plan: {replan_command}")]
    findings = [Finding("fits", True, f"{plan_path} fits the profile and cluster ({plural(len(plan.stages), 'stage')})")]
    changed = job_changes(plan, problem)
    findings.append(Finding("job", not changed,
                            f"the plan was made for another job than the files and flags give: {'; '.join(changed)}"
                            if changed else "made for this job (model, cluster, objective, samples, epochs, "
                            "required throughput)", f"re-plan for this job: {replan_command}; or, if the plan's job is "
                            "the one you mean, give check the flags you gave heterps plan" if changed else ""))
    if not plan.feasible:
        findings.append(Finding("feasible", False, "the plan file itself says it is infeasible",
                                f"re-plan: {replan_command}"))
    stale = stale_fields(plan, fresh)
    findings.append(Finding("fresh", not stale,
                            f"the plan's figures are stale (written -> recomputed): {'; '.join(stale[:4])}{' …' if len(stale) > 4 else ''}"
                            if stale else "every figure in the plan matches a recomputation from the files",
                            f"refresh it: {replan_command}" if stale else ""))
    over = [f"{t} {u} > limit {problem.limits[problem.types.index(t)]}" for t, u in fresh.resources.items()
            if u > problem.limits[problem.types.index(t)]]
    findings.append(Finding("limits", not over, f"resource limits exceeded: {', '.join(over)}" if over
                            else "within every resource limit", f"re-plan within the limits: {replan_command}" if over else ""))
    if problem.min_throughput > 0 and min_throughput is None and fresh.throughput < problem.min_throughput * (1 - 1e-12):
        findings.append(Finding("plan-throughput", False,
                                f"throughput {count(fresh.throughput, 1)} samples/s is under the job's requirement "
                                f"{count(problem.min_throughput, 1)}", f"re-plan: {replan_command}"))
    if max_cost is not None:
        ok = fresh.cost_usd <= max_cost * (1 + 1e-12)
        findings.append(Finding("max-cost", ok, f"cost {usd(fresh.cost_usd)} {'within' if ok else 'exceeds'} the "
                                f"--max-cost {usd(max_cost)}" + ("" if ok else f" by {usd(fresh.cost_usd - max_cost)} "
                                f"({100 * (fresh.cost_usd / max_cost - 1):.1f}%)"),
                                "" if ok else f"find a cheaper plan: {replan_command}, or raise the budget"))
    if min_throughput is not None:
        ok = fresh.throughput >= min_throughput * (1 - 1e-12)
        findings.append(Finding("min-throughput", ok, f"throughput {count(fresh.throughput, 1)} samples/s "
                                f"{'meets' if ok else 'is under'} --min-throughput {count(min_throughput, 1)}"
                                + ("" if ok else f" by {100 * (1 - fresh.throughput / min_throughput):.1f}%"),
                                "" if ok else f"re-plan with --min-throughput {min_throughput:g}: {replan_command}"))
    if baseline is not None:
        old, new = baseline.cost_usd, fresh.cost_usd
        rule = max_increase or Increase(0.0, True)
        ok = rule.allows(old, new)
        change = signed_usd(new - old) + (f" ({100 * (new / old - 1):+.1f}%)" if old > 0 else "")
        where = f"see where the cost rose: heterps diff {shlex.quote(baseline_path)} {shlex.quote(plan_path)}"
        if stale:  # the diff reads the written figures, so they must be the recomputed ones first
            where = f"refresh {plan_path} ({replan_command}), then {where}"
        unlike = incomparable(baseline, plan)
        caveat = f" (warning: {'; '.join(unlike)})" if unlike else ""
        findings.append(Finding("baseline", ok, f"cost {usd(old)} -> {usd(new)}, {change}; allowed increase {rule}{caveat}",
                                "" if ok else where, warn=new > old * (1 + REL_TOL) or bool(unlike)))
    if replan is not None:
        try:
            better = solve(replan, problem, seed=seed, progress=progress, options=SolveOptions())
        except InfeasibleError as exc:
            findings.append(Finding("replan", True, f"{replan} finds no feasible plan ({exc}); the committed plan stands"))
        else:
            if problem.objective == "time":  # the plan's own objective decides what wasteful means
                saving = 1 - fresh.throughput / better.throughput if better.throughput > 0 else 0.0
                found = (f"{replan} finds {count(better.throughput, 1)} samples/s against the plan's "
                         f"{count(fresh.throughput, 1)} ({100 * saving:.1f}% faster; tolerance {tolerance:g}%)")
            else:
                saving = 1 - better.cost_usd / fresh.cost_usd if fresh.cost_usd > 0 else 0.0
                found = (f"{replan} finds {usd(better.cost_usd)} against the plan's {usd(fresh.cost_usd)} "
                         f"({100 * saving:.1f}% cheaper; tolerance {tolerance:g}%)")
            ok = saving <= tolerance / 100 + 1e-12
            adopt = f"adopt it: {plan_command(profile_path, cluster_path, problem, plan, plan_path, replan)}"
            findings.append(Finding("replan", ok, found, "" if ok else adopt, warn=saving > 1e-9))
            if plan.optimal and replan == "exact" and saving > 1e-9:  # a false claim, whatever the tolerance
                findings.append(Finding("optimal", False, f"the plan says it is optimal, but exact finds one "
                                        f"{100 * saving:.2g}% better", adopt))
    return findings


@dataclass(frozen=True)
class Change:
    what: str
    old: float | str
    new: float | str

    @property
    def delta(self) -> float | None:
        if isinstance(self.old, (int, float)) and isinstance(self.new, (int, float)):
            return self.new - self.old
        return None

    @property
    def percent(self) -> float | None:
        d = self.delta
        return None if d is None or self.old == 0 else 100 * d / self.old


def stage_label(stage) -> str:
    return f"{stage.first}-{stage.last} on {stage.resource} x{stage.replicas}"


def pair_stages(old: list, new: list) -> list[tuple[int | None, int | None]]:
    """Old and new stages paired in chain order, most shared layers first (then the same type).

    An alignment, not pairing by index: with a stage inserted in the middle, the
    stages after it pair with themselves and only the new one shows as new.
    """
    def score(a, b) -> float:
        return len(set(a.layers) & set(b.layers)) + 0.5 * (a.resource == b.resource)

    n, m = len(old), len(new)
    best = np.zeros((n + 1, m + 1))
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            s = score(old[i - 1], new[j - 1])
            best[i, j] = max(best[i - 1, j], best[i, j - 1], best[i - 1, j - 1] + s if s > 0 else -1.0)
    pairs: list[tuple[int | None, int | None]] = []
    i, j = n, m
    while i or j:
        if i and j and score(old[i - 1], new[j - 1]) > 0 and \
                best[i, j] == best[i - 1, j - 1] + score(old[i - 1], new[j - 1]):
            pairs.append((i - 1, j - 1))
            i, j = i - 1, j - 1
        elif i and (not j or best[i, j] == best[i - 1, j]):
            pairs.append((i - 1, None))
            i -= 1
        else:
            pairs.append((None, j - 1))
            j -= 1
    return pairs[::-1]


JOB_FIELDS = ("model", "cluster", "objective", "batch_size", "samples", "epochs", "min_throughput", "max_cost")


def incomparable(old: PlanFile, new: PlanFile) -> list[str]:
    """Why two plans are not two answers to one question: each job setting that differs."""
    out = []
    for field in JOB_FIELDS:
        a, b = getattr(old, field), getattr(new, field)
        if a != b:
            out.append(f"{field} {_setting(a)} vs {_setting(b)}")
    if not out:
        return []
    return [f"the plans are for different jobs ({', '.join(out)}): their figures do not compare like for like"]


def diff(old: PlanFile, new: PlanFile) -> list[Change]:
    """Stages, resources, throughput, time and cost of two plans, side by side."""
    out = []
    for i, j in pair_stages(old.stages, new.stages):
        a = stage_label(old.stages[i]) if i is not None else "—"
        b = stage_label(new.stages[j]) if j is not None else "—"
        if i is not None and j is not None:
            what = f"stage {i}" if i == j else f"stage {i} → {j}"
        else:
            what = f"stage {i} (removed)" if i is not None else f"stage {j} (new)"
        out.append(Change(what, a, b))
    for t in dict.fromkeys([*old.resources, *new.resources]):
        out.append(Change(f"{t} units", old.resources.get(t, 0), new.resources.get(t, 0)))
    out += [Change("throughput samples/s", old.throughput, new.throughput),
            Change("training time s", old.time_s, new.time_s),
            Change("cost USD", old.cost_usd, new.cost_usd)]
    return out
