"""The Slurm batch script of a launch (``heterps launch``, docs/guide/launching.md): a heterogeneous job
of one component per run of nodes of one kind, so that Slurm gives each node rank the kind the plan
put there, each component asking for its nodes by ``--constraint``.

Slurm numbers the nodes of each component's step 0..n-1, so each component starts its own step and
adds its offset to ``$SLURM_NODEID``: the node ranks never rest on how Slurm orders the nodes of a
whole job. Node 0 (the first node of component 0) is torchrun's master. Every task first checks that
it sees the files the launch passes on (a node without the shared file system stops naming the path)
and that torchrun is on its PATH; the script ends every step when one fails.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from heterps_cli.errors import InputError
from heterps_cli.figures import plural
from heterps_cli.shell import Env, Word, command, comment, quote

SLURM_TIME = re.compile(r"(\d{1,4}-)?\d{1,6}(:\d{1,2}){0,2}")  # minutes, MM:SS, HH:MM:SS, D-HH[:MM[:SS]]
START_S = 900.0  # what the default --time allows for the job to start: model loads and torchrun's rendezvous


@dataclass(frozen=True)
class SlurmOptions:
    """What a launch asks of Slurm beyond the plan: the wall time (None: from the plan's prediction),
    each node kind's feature (default: the kind's own name), where the job's output goes, a shell line
    that activates heterps's environment on every node, and the paths every node must see."""

    time: str | None = None
    features: dict[str, str] = field(default_factory=dict)
    output_dir: str = "."
    setup: str | None = None
    shared: tuple[str, ...] = ()
    steps: int = 10  # training steps the run takes in all, for the default time


@dataclass(frozen=True)
class Component:
    """A run of the plan's nodes of one kind: one component of the heterogeneous job."""

    kind: str | None
    first: int  # the node rank of its first node
    processes: tuple[int, ...]  # per node
    gpus: tuple[int, ...]  # per node


def check_time(text: str) -> str:
    """``--time`` as Slurm reads it; an exit-2 error otherwise."""
    if not SLURM_TIME.fullmatch(text):
        raise InputError(None, None, "--time", f"{text!r} is not a Slurm time (MINUTES, HH:MM:SS or DAYS-HH:MM:SS)")
    return text


def default_time(plan, steps: int) -> tuple[str, str]:
    """Slurm's ``--time`` for ``steps`` of the plan: twice the steps' predicted time and
    :data:`START_S` to start, in whole minutes, with how it was found."""
    per_step = plan.batch_size * max(plan.micro_batches or 1, 1) / plan.throughput
    minutes = math.ceil((2 * steps * per_step + START_S) / 60)
    how = f"twice {plural(steps, 'step')} of {per_step:.3g} s predicted, and {START_S / 60:g} min to start"
    return f"{minutes // 60}:{minutes % 60:02d}:00", how


def components(counts: dict[str, int], kinds: list[str | None], gpus: tuple[int, ...]) -> list[Component]:
    """The nodes in launch order, cut where the kind changes."""
    out: list[Component] = []
    procs = list(counts.values())
    for i, kind in enumerate(kinds):
        if out and out[-1].kind == kind:
            last = out[-1]
            out[-1] = Component(kind, last.first, (*last.processes, procs[i]), (*last.gpus, gpus[i]))
        else:
            out.append(Component(kind, i, (procs[i],), (gpus[i],)))
    return out


def slurm_script(
    plan, source: str, run: list[Word], parts: list[Component], master_port: int, env, threads: int, opts: SlurmOptions
) -> str:
    """The sbatch script: its header, one ``#SBATCH`` block per component, and one step per component."""
    time, how = (opts.time, "as heterps launch --time gave it") if opts.time else default_time(plan, opts.steps)
    lines = [*_header(source, parts, f"--time {time}: {how}."), f"#SBATCH --job-name=heterps-{_slug(plan.model)}"]
    output = f"{opts.output_dir}/slurm-%j.out"
    if _plain(output):
        lines.append(f"#SBATCH --output={output}")
    else:  # an #SBATCH line is read without a shell
        lines.append("# --output left to Slurm (slurm-JOBID.out where sbatch runs): the folder's name is not plain")
    lines.append(f"#SBATCH --time={time}")
    for k, c in enumerate(parts):
        lines += ["#SBATCH hetjob"] if k else []
        lines += [f"#SBATCH --nodes={len(c.processes)}", "#SBATCH --ntasks-per-node=1"]
        lines.append(f"#SBATCH --cpus-per-task={max(c.processes) * threads}")
        lines += [f"#SBATCH --gres=gpu:{max(c.gpus)}"] if max(c.gpus) else []
        lines += [f"#SBATCH --constraint={opts.features.get(c.kind, c.kind)}"] if c.kind is not None else []
    lines += ["set -euo pipefail", *([opts.setup] if opts.setup else [])]
    lines += [f"export {name}={quote(value)}" for name, value in env]
    return "\n".join([*lines, *_steps(parts, run, master_port, opts), ""])


def _header(source: str, parts: list[Component], timing: str) -> list[str]:
    """What the script runs where, how to submit it, and what every node must see."""
    n = sum(len(c.processes) for c in parts)
    total = plural(sum(sum(c.processes) for c in parts), "process", "processes")
    shape = f", a heterogeneous job of {len(parts)} components (one per run of a node kind)." if len(parts) > 1 else "."
    lines = [
        "#!/bin/bash",
        comment(f"heterps launch {source}: {total} on {plural(n, 'node')}{shape}"),
        "# Submit with: sbatch [--partition P] [--account A] launch.sbatch (your site's partition and account).",
    ]
    if any(c.kind for c in parts):
        lines.append(
            "# Each component asks for its kind by --constraint: the feature named as the kind unless heterps launch"
        )
        lines.append("# --constraint KIND=FEATURE gave another (sinfo -o '%N %f' lists your nodes' features).")
    lines += [
        comment(timing),
        "# Every node must see the plan copy, the task or model file and the checkpoint folder at these paths (a",
        "# shared file system); each node checks before it starts, and a node that cannot stops the job.",
    ]
    for c in parts:
        for j, (count, g) in enumerate(zip(c.processes, c.gpus, strict=True)):
            what = f"  node {c.first + j}: {c.kind or 'this machine'}, {plural(count, 'process', 'processes')}"
            lines.append(comment(what + (f", {g} on GPUs" if g else "")))
    return lines


def _steps(parts: list[Component], run: list[Word], master_port: int, opts: SlurmOptions) -> list[str]:
    """Node 0 as the master, one step per component in the background, and every step ended when one fails."""
    het, n = len(parts) > 1, sum(len(c.processes) for c in parts)
    nodelist = "SLURM_JOB_NODELIST_HET_GROUP_0" if het else "SLURM_JOB_NODELIST"
    lines = [f'MASTER_ADDR=$(scontrol show hostnames "${nodelist}" | head -n 1)', "export MASTER_ADDR", "steps=()"]
    lines.append("trap 'kill ${steps[@]+\"${steps[@]}\"} 2>/dev/null || true' EXIT  # ends every step on any exit")
    for k, c in enumerate(parts):
        group = f"--het-group={k} " if het else ""
        lines += [
            f"srun {group}--ntasks-per-node=1 bash -c {quote(_task(c, n, run, master_port, opts))} &",
            "steps+=($!)",
        ]
    return [
        *lines,
        'for _ in "${steps[@]}"; do',
        '  wait -n || { echo "heterps: a node failed: ending the job" >&2; exit 1; }',
        "done",
        "trap - EXIT",
    ]


def _task(c: Component, n: int, run: list[Word], master_port: int, opts: SlurmOptions) -> str:
    """What each node of component ``c`` runs: its node rank and process count, the checks, torchrun."""
    lines = ['case "$SLURM_NODEID" in']
    lines += [f"  {j}) NODE={c.first + j} NPROC={count} ;;" for j, count in enumerate(c.processes)]
    lines += ['  *) echo "heterps: this component has no node $SLURM_NODEID" >&2; exit 2 ;;', "esac"]
    lines += check_lines(opts.shared, "$(hostname) (node $NODE)")
    rendezvous: list[Word] = ["--nnodes", str(n), "--node-rank", Env("NODE"), "--master-addr", Env("MASTER_ADDR")]
    rendezvous += ["--master-port", str(master_port), "--nproc-per-node", Env("NPROC")]
    lines.append(f"exec {command(['torchrun', *rendezvous, *run])}")
    return "\n".join(lines)


def check_lines(shared: tuple[str, ...], where: str) -> list[str]:
    """Shell lines that stop a node which cannot see a shared path or has no torchrun on its PATH."""
    lines = []
    if shared:
        lines.append(f"for path in {' '.join(quote(p) for p in shared)}; do")
        lines.append(
            f'  [ -e "$path" ] || {{ echo "heterps: $path is not on {where}: it must be on a file system '
            'every node shares, at the same path" >&2; exit 2; }'
        )
        lines.append("done")
    lines.append(
        f'command -v torchrun >/dev/null || {{ echo "heterps: no torchrun on {where}: activate the environment '
        'heterps is installed in (heterps launch --setup)" >&2; exit 2; }'
    )
    return lines


def _plain(text: str) -> bool:
    """Whether ``text`` reads back as written on an ``#SBATCH`` line, which Slurm reads without a shell."""
    return bool(text) and not any(c.isspace() or c in "#\"'\\" or not c.isprintable() for c in text)


def check_feature(entry: str, kinds: list[str]) -> tuple[str, str]:
    """A ``--constraint KIND=FEATURE``: a kind of the plan's nodes and a feature an #SBATCH line holds."""
    kind, sep, feature = entry.partition("=")
    if not sep or kind not in kinds or not _plain(feature):
        raise InputError(
            None,
            None,
            "--constraint",
            f"{entry!r} is not KIND=FEATURE with KIND one of the plan's node kinds ({', '.join(kinds) or 'none'}) "
            "and FEATURE a Slurm feature expression without spaces or quotes",
        )
    return kind, feature


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in text)[:40] or "plan"
