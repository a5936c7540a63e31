"""The exact optimum when units come in whole nodes (docs/spec.md section 1e; docs/exact.md section 7).

Once a rental (a count of each node kind) is fixed, every unit it holds is paid for, so the run
costs ``rate x work / throughput`` and the best plan on it is the fastest one within its units,
over its links. The optimum rents one of :attr:`heterps_cli.nodes.Nodes.menu`'s rentals (any
other is beaten on price, units and links by one of them).

The walk goes down the menu, cheapest first, with a throughput ``target``:

* a rental that cannot reach ``target`` is passed over (one DP question, and none at all when a
  rental with at least its units and links already could not);
* the first that can is asked for its fastest plan, at throughput ``X``, which is a candidate;
  every later rental costs at least as much an hour, so it can win only by being faster:
  ``target`` becomes just above ``X``;
* objective ``cost`` stops when ``rate x work / X_max`` (``X_max``: the fastest plan on any
  rental, found on :func:`widest_rentals`) passes the best cost, since no later rental can cost
  less; objective ``time`` wants the first rental that reaches ``X_max`` and finds it by bisection
  (:meth:`_Walk._cheapest_reaching`: one that cannot reach it rules out every rental it holds); with
  ``--max-cost`` it stops when that floor passes the budget.

Why it is exact: let P* be an optimal plan on its rental R*, and R' the menu's rental that is or
beats R*. When the walk reaches R', either ``target`` is at most P*'s throughput, so R' reaches it
and its fastest plan is at least as fast as P* and costs at most R*'s rate over that, or an
earlier, no dearer rental already gave a plan at least as fast: both are no worse than P*.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np

import heterps_cli.schedulers.exact.walks as walks
from heterps_cli.costmodel import throughput_floor
from heterps_cli.errors import InfeasibleError, TooLarge
from heterps_cli.figures import count, usd
from heterps_cli.formulas import SLACK, run_cost
from heterps_cli.nodes import Menu, Nodes
from heterps_cli.objective import Objective
from heterps_cli.plan import Plan, make_plan
from heterps_cli.problem import Problem
from heterps_cli.schedulers.base import Clock, ExactOptions, Progress, SolveOptions
from heterps_cli.schedulers.exact.kernel import Candidate
from heterps_cli.schedulers.exact.pipeline import solver_for
from heterps_cli.schedulers.exact.reach import more_units
from heterps_cli.schedulers.exact.step import StepSolver, schedule_of
from heterps_cli.schedulers.exact.terms import most_stages


def solve(
    problem: Problem, *, seed: int = 0, progress: Progress | None = None, options: SolveOptions | None = None
) -> Plan:
    """The provably cheapest (``cost``) or fastest (``time``) plan over rentals of whole nodes."""
    assert problem.nodes is not None
    start = time.perf_counter()
    walk = _Walk(problem, seed, progress, Clock.of(options, start))
    if isinstance(options, ExactOptions) and problem.objective is Objective.TIME and problem.max_cost is None:
        walk.at_least = options.at_least  # another micro-batch's plan is this fast: only a faster one counts
    best = walk.run()
    notes: tuple[str, ...] = (
        f"{walk.asked:,} of {len(walk.menu.rate):,} rentals that no other beats on price, units and links were asked "
        "whether they reach the throughput, and "
        f"{walk.questions.fastest_asked:,} for their fastest plan (docs/exact.md section 7)",
    )
    gap = None
    if walk.stopped_at is not None:
        floor = run_cost(problem.work, walk.x_max, float(walk.menu.rate[walk.stopped_at]))
        gap = (
            max(0.0, best.cost_usd / floor - 1)
            if problem.objective is Objective.COST
            else 1 - best.throughput / walk.x_max
        )
        notes += (
            f"exact stopped at the --time-limit before asking every rental: within {100 * gap:.2f}% of the optimum",
        )
    if walk.questions.relaxed:
        notes += (
            "exact relaxed a limit on some rental (honouring it needs more states than the DP holds), "
            "so it could not prove this plan optimal",
        )
    optimal = gap is None and not walk.questions.relaxed
    plan = best.but(optimal=optimal, gap=gap, notes=list(notes), solve_s=time.perf_counter() - start)
    assert plan.feasible, "the exact solver produced a plan that breaks a constraint"
    return plan


class _Walk:
    """The walk down the menu (the module docstring): its state and what it asked."""

    def __init__(self, problem: Problem, seed: int, progress: Progress | None, clock: Clock, every: bool = False):
        assert problem.nodes is not None
        self.p, self.seed, self.progress, self.clock = problem, seed, progress, clock
        self.every = every  # the frontier's walk: on to the fastest plan, each rental's fastest kept in found
        self.found: list[Candidate] = []
        self.menu = problem.nodes.menu
        self.asked = 0
        self.stopped_at: int | None = None
        self.x_max = 0.0
        self.at_least = 0.0  # objective time: only a plan at least this fast is wanted (InfeasibleError: none)
        self.known: list[tuple[float, float]] = []  # the frontier's: (rate, throughput) of plans found already
        self.questions = _Questions(problem, every)

    def run(self) -> Plan:
        p, menu = self.p, self.menu
        assert p.nodes is not None
        self.x_max = self._fastest_of_all()
        by_time = p.objective is Objective.TIME and not self.every
        # x_max within SLACK: the fastest plan's own figure can sit an ulp above what a grid's test of
        # "reaches X" grants at exactly X (a pipeline's relaxation rounds the other way).
        top = self.x_max * (1 - SLACK)
        if by_time and p.max_cost is None and (found := self._cheapest_reaching(top)) is not None:
            return found
        target = top if by_time and p.max_cost is None else throughput_floor(p)
        best: Plan | None = None
        cannot: list[int] = []  # rows known not to reach target (nor any higher one)
        for row in range(len(menu.rate)):
            floor = run_cost(p.work, self.x_max, float(menu.rate[row]))  # no plan here or later costs less
            if (best is not None and not by_time and not self.every and floor >= best.cost_usd * (1 - SLACK)) or (
                p.max_cost is not None and floor > p.max_cost * (1 + SLACK)
            ):
                break
            if self.every:  # a plan no faster than one already found at no higher rate is beaten
                target = max(target, self._beaten_below(float(menu.rate[row])))
            if self.every and target > self.x_max * (1 + SLACK):
                break  # the fastest plan is found
            if cannot and _no_better(menu, row, np.array(cannot)):
                continue
            if self.clock.out_of_time() and best is not None:
                self.stopped_at = row
                break
            if self.progress is not None:
                self.progress(f"exact: rental {row + 1:,} of {len(menu.rate):,}", completed=row, total=len(menu.rate))
            questions, reaching = self._ask(row, target)
            if reaching is None:
                cannot.append(row)
                continue
            cand = self.questions.fastest(questions, target) if target < top else reaching.cheapest(target)
            assert cand is not None, "the rental reaches the target"
            plan = self._plan(cand, row)
            if self.every:
                self.found.append(
                    replace(
                        cand,
                        cost=plan.cost_usd,
                        rate=plan.rate_usd_per_hour or 0.0,
                        throughput=plan.throughput,
                        rental=plan.rental,
                    )
                )
            if plan.feasible and (best is None or _better(p.objective, plan, best)):
                best = plan
            if by_time and plan.throughput >= self.x_max * (1 - SLACK) and plan.feasible:
                break  # the fastest any rental reaches, on the cheapest rental that reaches it
            target = float(np.nextafter(plan.throughput, np.inf))
        if best is None and self.known:
            raise InfeasibleError("every plan here is beaten by one the frontier already holds")
        if best is None:
            raise InfeasibleError(_over_budget(p))
        return best

    def _ask(self, row: int, target: float) -> tuple[list[_Lazy], _Lazy | None]:
        """Rental ``row``'s questions, and the first that reaches ``target`` (None: the rental does not)."""
        self.asked += 1
        questions = self.questions.of(self.menu.counts[row])
        return questions, next((q for q in questions if q.reachable(target)), None)

    def _beaten_below(self, rate: float) -> float:
        """Just above the fastest of :attr:`known` at a rate of at most ``rate`` (0: none)."""
        fastest = max((x for r, x in self.known if r <= rate * (1 + 1e-12)), default=0.0)
        return float(np.nextafter(fastest, np.inf)) if fastest > 0 else 0.0

    def _cheapest_reaching(self, top: float) -> Plan | None:
        """Objective time: the plan on the first rental of the menu that reaches ``top``, found by
        bisection. Each question is the middle of the rentals still open: cheaper than the first known to
        reach it, and held by none known not to (:func:`_no_better`); one that reaches closes every
        dearer rental, one that does not closes those it holds. On a menu of one kind of node that is a
        binary search (docs/exact.md section 7). None where its plan is not the fastest (then the walk
        goes down the menu as for any target)."""
        menu = self.menu
        cannot: list[int] = []
        first: tuple[int, _Lazy] | None = None  # the cheapest rental known to reach top, and its question
        while True:
            end = first[0] if first is not None else len(menu.rate)
            open_ = [r for r in range(end) if not (cannot and _no_better(menu, r, np.array(cannot)))]
            if not open_ or (self.clock.out_of_time() and first is not None):
                self.stopped_at = open_[0] if open_ else None
                break
            row = open_[len(open_) // 2]
            if self.progress is not None:
                self.progress(f"exact: {len(open_):,} rentals left to bisect", completed=len(menu.rate) - len(open_))
            _, reaching = self._ask(row, top)
            if reaching is None:
                cannot.append(row)
            else:
                first = (row, reaching)
        if first is None:
            return None
        cand = first[1].cheapest(top)
        assert cand is not None, "the rental reaches the target"
        plan = self._plan(cand, first[0])
        return plan if plan.feasible and plan.throughput >= self.x_max * (1 - SLACK) else None

    def _fastest_of_all(self) -> float:
        """The fastest throughput any rental reaches (its widest rentals hold the answer); raises
        InfeasibleError when no plan fits or none is fast enough."""
        p = self.p
        assert p.nodes is not None
        # The frontier refuses (TooLarge) rather than relax a limit: a frontier of relaxed plans is not exact.
        fastest = None
        for counts in widest_rentals(p.nodes):
            above = float(np.nextafter(fastest.throughput, np.inf)) if fastest is not None else self.at_least
            found = self.questions.fastest(self.questions.of(counts), above)
            if found is not None and (fastest is None or found.throughput > fastest.throughput):
                fastest = found
        if fastest is None and self.at_least > 0:
            raise InfeasibleError(f"no plan reaches {count(self.at_least, 1)} samples/s")
        if fastest is None:
            raise InfeasibleError(_nothing_fits(p))
        if fastest.throughput < throughput_floor(p):
            every_node = p.on_rental(p.nodes.available)[-1]  # every node, over the network
            raise InfeasibleError(f"{_too_slow(p, fastest.throughput)}. {more_units(every_node, nodes=True)}.")
        return fastest.throughput

    def _plan(self, cand: Candidate, row: int) -> Plan:
        assert self.p.nodes is not None
        rental = {n: int(c) for n, c in zip(self.p.nodes.names, self.menu.counts[row]) if c}
        schedule = schedule_of(self.p, cand.stages)
        return make_plan(self.p, schedule, cand.replicas, scheduler="exact", seed=self.seed, rental=rental)


def frontier_candidates(
    problem: Problem, progress: Progress | None, clock: Clock, known: list[Candidate] | None = None
) -> tuple[list[Candidate], float | None]:
    """Section 1e's frontier: the fastest plan of every rental the walk stops at, priced by its rental,
    and the throughput up to which they are exact when the clock stopped the walk (None: it finished).

    A frontier plan is the fastest on its rental (on that rental a slower plan
    only costs more), and the walk stops at that rental unless an earlier, no dearer one was already
    as fast (the module docstring): so every frontier plan, or one as good, is among these. Stopped
    early, every rental left is dearer than the one the fastest plan found runs on, so no plan there
    as slow as that one beats it: the candidates are exact up to its throughput."""
    walk = _Walk(problem.replace(objective=Objective.COST), 0, progress, clock, every=True)
    walk.known = [(c.rate, c.throughput) for c in known or ()]
    walk.run()
    cut_at = max(c.throughput for c in walk.found) if walk.stopped_at is not None and walk.found else None
    return walk.found, cut_at


class _Questions:
    """The questions rentals ask and their solvers; a solver shares the stage table of an earlier
    question with the same terms."""

    def __init__(self, problem: Problem, every: bool):
        self.p, self.every = problem, every
        self.fastest_asked = 0
        self.relaxed = False  # some rental's question needed more states than the DP holds
        self.tables: dict[tuple, StepSolver] = {}  # a solver per set of question terms, for its stage table

    def of(self, counts: np.ndarray) -> list[_Lazy]:
        """The questions of a rental of ``counts`` nodes (:meth:`Problem.on_rental`), each solved when asked."""
        return [_Lazy(self, q) for q in self.p.on_rental(counts)]

    def solver(self, question: Problem):
        """A solver for one rental's question, sharing the stage table of an earlier question with the
        same terms (links, and the types it has units of): most rentals differ only in their limits."""
        key = (question.odt.tobytes(), question.bandwidth.tobytes(), (question.limits > 0).tobytes())
        like = self.tables.get(key)
        solver = solver_for(question, None, relax=not self.every, like=like, shared=True)
        grids = most_stages(question) if question.pipelined else 1  # a pipeline keeps a grid per stage count
        if like is None and (question.n_layers + 1) ** 2 * question.n_types * grids <= TABLE_CACHE_CELLS:
            self.tables[key] = solver
        return solver

    def fastest(self, questions: list, at_least: float = 0.0) -> Candidate | None:
        """The fastest plan over a rental's questions (each one's fastest: the rental's fastest), where
        one is at least ``at_least`` fast; each question after the first only searches above the
        fastest found so far."""
        self.fastest_asked += 1
        best = None
        for solver in questions:
            above = float(np.nextafter(best.throughput, np.inf)) if best is not None else at_least
            cand, _ = solver.max_throughput(at_least=above)
            if cand is not None and not cand.within:  # the DP relaxed a limit: the best plan found within all
                self.relaxed = True
                cand = solver.fastest_found
            if cand is not None and (best is None or cand.throughput > best.throughput):
                best = cand
        return best


class _Lazy:
    """One of a rental's questions, its solver made when first asked (most rentals are settled by
    their first question)."""

    def __init__(self, questions: _Questions, question: Problem):
        self.questions, self.question, self._solver = questions, question, None

    @property
    def solver(self):
        if self._solver is None:
            self._solver = self.questions.solver(self.question)
        return self._solver

    def reachable(self, target: float) -> bool:
        return self.solver.reachable(target)

    def cheapest(self, target: float) -> Candidate | None:
        return self.solver.cheapest(target)

    def max_throughput(self, at_least: float = 0.0):
        return walks.max_throughput(self.solver, at_least=at_least)

    @property
    def fastest_found(self) -> Candidate | None:
        return self.solver.fastest_found


def _no_better(menu: Menu, row: int, rows: np.ndarray) -> bool:
    """Whether some rental of ``rows`` holds at least the units of ``row``, over links at least as
    fast for every type, with at least as many of a linked type's units on its first node and, where
    ``row`` is one node moving activations over its links, is one too: then what ``row`` reaches, it
    reaches."""
    as_much = (menu.capacity[rows] >= menu.capacity[row]).all(axis=1)
    as_fast = (menu.links[rows] >= menu.links[row]).all(axis=1)
    linked = menu.links[row] > 0
    as_fast &= (menu.room[rows][:, linked] >= menu.room[row][linked]).all(axis=1)
    if menu.inside[row] >= 0:
        as_fast &= menu.inside[rows] >= 0
    return bool((as_much & as_fast).any())


# Stage tables (a pipeline's grids, all stage counts) kept for reuse up to this many cells each, at
# about 90 bytes a cell: the few sets of terms a walk meets then hold well under a GB.
TABLE_CACHE_CELLS = 1_000_000
MAX_WIDEST = 4096  # ways to choose each linked type's links: the exact solver asks each its fastest plan


def widest_rentals(nodes: Nodes) -> list[np.ndarray]:
    """Rentals at least one of which is as fast as any rental: every rental holds no more nodes than
    one of them, whose first node of each type some kind links is of the same kind (the same link,
    the same room). Per choice, for each such type, of no choice or the kind of its first node: no
    node of the kinds before it that hold the type, and every available node of the rest; and
    each single node with links (which also moves activations over them)."""
    K, T = nodes.units.shape
    out = [nodes.available.copy()]
    if nodes.link is None:
        return out
    linked = [t for t in range(T) if (nodes.link[:, t] > 0).any()]
    choices = [[-1, *np.flatnonzero(nodes.units[:, t] > 0)] for t in linked]
    if math.prod(len(c) for c in choices) > MAX_WIDEST:
        raise TooLarge(
            "cluster's nodes",
            f"its first nodes can be chosen in more than {MAX_WIDEST:,} ways (for every type some kind links, "
            "none or a kind holding it); give link_gbps for fewer types, or list fewer kinds",
        )
    for pick in itertools.product(*choices):
        counts = nodes.available.copy()
        for t, k in zip(linked, pick):
            if k >= 0:
                counts[(nodes.units[:, t] > 0) & (np.arange(K) < k)] = 0
        if all(k < 0 or counts[k] > 0 for k in pick):
            out.append(counts)
    out += [np.eye(K, dtype=np.int64)[k] for k in nodes.linked]
    unique = {tuple(c) for c in out if c.any()}
    return [np.array(c) for c in sorted(unique)]


def _better(objective: Objective, a: Plan, b: Plan) -> bool:
    if objective is Objective.COST:
        return a.cost_usd < b.cost_usd * (1 - SLACK) or (a.cost_usd <= b.cost_usd and a.throughput > b.throughput)
    return a.throughput > b.throughput * (1 + SLACK) or (a.throughput >= b.throughput and a.cost_usd < b.cost_usd)


def _nothing_fits(problem: Problem) -> str:
    return (
        "no plan fits on every node the cluster offers, even with one replica per stage: the nodes hold "
        f"{', '.join(f'{count(int(u))} {t}' for t, u in zip(problem.types, problem.limits))}"
    )


def _too_slow(problem: Problem, fastest: float) -> str:
    return (
        f"no plan reaches the required {count(problem.min_throughput, 1)} samples/s: on every node the cluster "
        f"offers, the fastest reaches {count(fastest, 1)} samples/s"
    )


def _over_budget(problem: Problem) -> str:
    assert problem.max_cost is not None, "within the nodes and the throughput, only the budget rules a plan out"
    return (
        f"no rental of whole nodes runs the job within {usd(problem.max_cost)}: every plan fast enough costs "
        "more. Raise the budget (--max-cost)"
    )


def what_if(problem: Problem, plan: Plan, fastest: Callable[[Problem], float | None] | None = None) -> list[dict]:
    """Section 1e's what-if (``heterps plan --explain``): for each node kind, the plan's rental with one
    node of it more and one fewer, and the fastest plan on that rental with what it costs (every
    node paid for): ``{"kind", "change", "rental", "throughput", "cost_usd", "meets"}`` (throughput
    and cost None where no plan fits on it; ``meets``: the job's required throughput and budget).
    ``fastest``: the throughput of the plan's own search on one of a rental's questions (section 1i
    mixes), else this solver's fastest plan of one-type stages."""
    fastest = fastest or _fastest
    nodes = problem.nodes
    assert nodes is not None and plan.rental is not None
    counts = nodes.counts(plan.rental)
    out = []
    for k, kind in enumerate(nodes.names):
        for change in (1, -1):
            other = counts.copy()
            other[k] += change
            if not 0 <= other[k] <= nodes.available[k] or not other.any():
                continue
            rate = float(other @ nodes.price)
            found = [fastest(q) for q in problem.on_rental(other)]
            x = max((f for f in found if f is not None), default=None)
            cost = None if x is None else float(run_cost(problem.work, x, rate))
            meets = x is not None and x >= throughput_floor(problem)
            if meets and problem.max_cost is not None and cost is not None:
                meets = cost <= problem.max_cost * (1 + SLACK)
            rental = {name: int(n) for name, n in zip(nodes.names, other) if n}
            out.append(
                {"kind": kind, "change": change, "rental": rental, "throughput": x, "cost_usd": cost, "meets": meets}
            )
    return out


def _fastest(question: Problem) -> float | None:
    """The throughput of the fastest plan of one-type stages on one of a rental's questions."""
    found = walks.max_throughput(solver_for(question, None))[0]
    return None if found is None else float(found.throughput)
