"""Profile a model in several fresh processes and keep each layer's median (``--processes N``).

On a shared machine one process's timings of a memory-bound layer can sit 20-30%
above or below another's, however many runs each takes
(``benchmarks/bench_profile.py``): where a process's memory lands, and what the
machine's neighbours do meanwhile, shift them all together. Runs within one
process cannot average that out; the median over several processes can.

Each process runs :func:`heterps_cli.profiling.measure.measure` (this module is its
entry point: ``python -m heterps_cli.profiling.processes ARGS OUT``) and writes
the result as JSON; the parent combines them.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from heterps_cli.errors import InputError
from heterps_cli.profiling.measure import LayerProfile, Profiled, load_model, measure
from heterps_cli.progress import Progress, quiet


def measure_in_processes(
    spec: str,
    batch_size: int,
    input_shape,
    resource: str,
    *,
    device: str,
    repetitions: int,
    link_gbps: float | None,
    processes: int,
    granularity: str = "layers",
    progress: Progress | None = None,
) -> Profiled:
    """``processes`` independent profiles of the model ``spec``, each in a fresh Python process, combined."""
    report = progress or quiet
    args = {
        "spec": spec,
        "batch_size": batch_size,
        "input_shape": list(input_shape) if input_shape else None,
        "resource": resource,
        "device": device,
        "repetitions": repetitions,
        "link_gbps": link_gbps,
        "granularity": granularity,
    }
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(processes):
            report(f"process {i + 1}/{processes}: profiling {spec} in a fresh process", completed=i, total=processes)
            out = Path(tmp) / f"run{i}.json"
            done = subprocess.run(
                [sys.executable, "-m", "heterps_cli.profiling.processes", json.dumps(args), str(out)],
                capture_output=True,
                text=True,
            )
            if done.returncode != 0:
                lines = done.stderr.strip().splitlines()
                raise InputError(
                    None,
                    None,
                    "MODEL",
                    f"profiling process {i + 1} of {processes} failed: "
                    f"{lines[-1] if lines else f'exit code {done.returncode}'}",
                )
            runs.append(from_dict(json.loads(out.read_text())))
    report("combining the processes", completed=processes, total=processes)
    return combine(runs)


def combine(runs: list[Profiled]) -> Profiled:
    """Each layer's oct, odt and alpha, and the whole step, as the median over the runs; the rest from the first."""
    first = runs[0]
    if len(runs) == 1:
        return first
    if any([layer.name for layer in run.layers] != [layer.name for layer in first.layers] for run in runs):
        raise InputError(
            None,
            None,
            "MODEL",
            "the processes traced different layers: the model's forward pass "
            "is not deterministic, so its profile cannot be combined",
        )

    def median(values) -> float:
        return float(statistics.median(values))

    layers = [
        dataclasses.replace(
            layer,
            oct=median(r.layers[i].oct for r in runs),
            odt=median(r.layers[i].odt for r in runs),
            alpha=median(r.layers[i].alpha for r in runs),
            cv=median(r.layers[i].cv for r in runs),
        )
        for i, layer in enumerate(first.layers)
    ]
    notes = list(dict.fromkeys(note for run in runs for note in run.notes))
    notes.append(f"oct, odt and alpha: the median over {len(runs)} profiles, each in a fresh process")
    return dataclasses.replace(
        first,
        layers=layers,
        step=median(r.step for r in runs),
        bandwidth=median(r.bandwidth for r in runs),
        notes=notes,
    )


def from_dict(data: dict) -> Profiled:
    return Profiled(**{**data, "layers": [LayerProfile(**layer) for layer in data["layers"]]})


def _worker(args: dict, out: Path) -> int:
    try:
        model = load_model(
            args["spec"],
            args["batch_size"],
            tuple(args["input_shape"]) if args["input_shape"] else None,
            args["granularity"],
        )
        measured = measure(
            model, args["resource"], device=args["device"], repetitions=args["repetitions"], link_gbps=args["link_gbps"]
        )
    except InputError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    out.write_text(json.dumps(dataclasses.asdict(measured)))
    return 0


if __name__ == "__main__":
    sys.exit(_worker(json.loads(sys.argv[1]), Path(sys.argv[2])))
