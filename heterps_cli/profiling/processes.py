"""Profile a model in several fresh processes and keep each layer's median (``--processes N``).

On a shared machine one process's timings of a memory-bound layer can sit 20-30%
above or below another's, however many runs each takes
(``benchmarks/bench_profile.py``): where a process's memory lands, and what the
machine's neighbours do meanwhile, shift them all together. Runs within one
process cannot average that out; the median over several processes can.

With ``concurrent`` (``--concurrent K``, cpu only) the processes run K at a time,
one per core, so that every layer is timed while K - 1 other units of the
machine are busy with the same work, as they are in a plan that uses K units:
on this 2-core machine two replicas of mlp slow each other by 0-25%
(docs/fidelity.md), which a profile taken alone does not see. The link is then
measured once, before they start, so that its probe runs on an idle machine; its
all-reduce latency is then timed again by pairs of the processes, after a
whole-model step each, as replicas pay it (:mod:`.replicas`).

Each process runs :func:`heterps_cli.profiling.measure.measure` (this module is its
entry point: ``python -m heterps_cli.profiling.processes ARGS OUT``) and writes
the result as JSON; the parent combines them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from heterps_cli.errors import InputError
from heterps_cli.profiling.links import Link, free_port, link_bandwidth, sigint_ignored
from heterps_cli.profiling.load import Load, between, snapshot
from heterps_cli.profiling.measure import LayerProfile, Profiled, load_model, measure
from heterps_cli.profiling.ties import Tie
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
    granularity: str = "auto",
    concurrent: int | None = None,
    progress: Progress | None = None,
    loss: str = "mse",
    optimizer: str = "sgd",
    precision: str | None = None,
) -> Profiled:
    """``processes`` independent profiles of the model ``spec``, each in a fresh Python process (one after
    another, or ``concurrent`` at a time), combined."""
    report = progress or quiet
    notes: list[str] = []
    link = None
    if concurrent is not None:  # measured once, before any process is busy: each would disturb the others'
        _check_concurrent(device, processes, concurrent)
        link = link_bandwidth(device, link_gbps, report, notes)
    args = {
        "spec": spec,
        "batch_size": batch_size,
        "input_shape": list(input_shape) if input_shape else None,
        "resource": resource,
        "device": device,
        "repetitions": repetitions,
        "link_gbps": link_gbps,
        "link": dataclasses.asdict(link) if link is not None else None,
        "granularity": granularity,
        "loss": loss,
        "optimizer": optimizer,
        "precision": precision,
    }
    started = snapshot()
    runs = _run_all(args, processes, concurrent, report)
    report("combining the processes", completed=processes, total=processes)
    combined = dataclasses.replace(combine(runs), load=between(started, snapshot()))
    if concurrent is not None:
        assert link is not None
        others = f"{concurrent - 1} other {'units' if concurrent > 2 else 'unit'} of this machine"
        combined.bandwidth_how = link.how
        if combined.all_reduce_latency is not None and any(note == PAIRED for note in combined.notes):
            combined.idle_latency = link.all_reduce_latency
        combined.notes = [
            *notes,
            *(_paired_note(combined, link) if note == PAIRED else note for note in combined.notes),
            f"oct and alpha: timed {concurrent} processes at a time, one per core: each layer ran while {others} "
            f"{'were' if concurrent > 2 else 'was'} busy with the same work, as in a plan that uses {concurrent} units",
        ]
    return combined


PAIRED = "all_reduce_latency: timed by pairs of the processes"  # a process's mark, replaced by _paired_note


def _paired_note(combined: Profiled, link: Link) -> str:
    assert combined.all_reduce_latency is not None and link.all_reduce_latency is not None
    return (
        f"all_reduce_latency {combined.all_reduce_latency * 1e3:.3f} ms: timed as replicas pay it, by pairs of "
        "the processes, each all-reducing the model's gradients (at most 1 MiB) after a whole-model step: their "
        "mean time there, the wait for the partner included, less the bytes over the bandwidth (the median over "
        f"the pairs; the idle link's line read {link.all_reduce_latency * 1e3:.3f} ms)"
    )


def _run_all(args: dict, processes: int, concurrent: int | None, report: Progress) -> list[Profiled]:
    """Each process's profile: one after another, or ``concurrent`` at a time."""
    spec = args["spec"]
    with tempfile.TemporaryDirectory() as tmp:
        outs = [Path(tmp) / f"run{i}.json" for i in range(processes)]
        if concurrent is not None:
            for wave in range(0, processes, concurrent):
                report(
                    f"profiling {spec}: processes {wave + 1}-{wave + concurrent} of {processes}, {concurrent} at once",
                    completed=wave,
                    total=processes,
                )
                run_together(args, outs[wave : wave + concurrent], first=wave, of=processes)
        else:
            for i, out in enumerate(outs):
                report(
                    f"process {i + 1}/{processes}: profiling {spec} in a fresh process", completed=i, total=processes
                )
                _finished(i, processes, subprocess.run(_command(args, out), capture_output=True, text=True))
        runs = [from_dict(json.loads(out.read_text())) for out in outs]
    return runs


def _command(args: dict, out: Path, module: str = __name__) -> list[str]:
    return [sys.executable, "-m", module, json.dumps(args), str(out)]


def usable_cores() -> int:
    """The cores this process may run on: as many cpu units as can be busy at once here."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _check_concurrent(device: str, processes: int, concurrent: int) -> None:
    """Exit 2 unless ``concurrent`` cpu processes at a time can run ``processes`` in whole waves here."""
    if device != "cpu":
        why = "on cuda one device is one unit, so there is nothing to run beside it"
        raise InputError(None, None, "--concurrent", f"--concurrent runs several cpu units at once; {why}")
    cores = usable_cores()
    if not 2 <= concurrent <= cores:
        why = f"2 or more, and at most the {cores} cores this process may use (got {concurrent})"
        raise InputError(None, None, "--concurrent", f"the processes at a time, one per core: {why}")
    if processes % concurrent:
        others = f"{concurrent - 1} {'neighbour' if concurrent == 2 else 'neighbours'}"
        why = f"so that every layer is timed with {others} busy (got --processes {processes})"
        raise InputError(None, None, "--processes", f"must be a multiple of --concurrent {concurrent}, {why}")


def run_together(args: dict, outs: list[Path], first: int = 0, of: int | None = None, module: str = __name__) -> None:
    """The profiling processes of one wave (``python -m module``) started at once and waited for; all of
    them ended on an error or Ctrl-C (``first``, ``of``: their numbers among all, for an error)."""
    started: list[subprocess.Popen] = []
    meet = tempfile.mkdtemp(prefix="heterps-wave-")
    port = free_port()  # where the wave's pairs meet to time their all-reduce (profiling.replicas)
    try:
        with sigint_ignored():  # only this process answers Ctrl-C, by ending them (finally)
            for i, out in enumerate(outs):
                command = _command({**args, "meet": meet, "together": len(outs), "index": i, "port": port}, out, module)
                started.append(subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
        for i, proc in enumerate(started):
            _, err = proc.communicate()
            _finished(first + i, of or len(outs), subprocess.CompletedProcess(proc.args, proc.returncode, "", err))
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        shutil.rmtree(meet, ignore_errors=True)


MEET_TIMEOUT_S = 600.0


def _all_there(meet: Path, what: str, together: int) -> bool:
    return len(list(meet.glob(f"{what}-*"))) >= together


def _meet(meet: Path, index: int, together: int) -> None:
    """Wait until every process of the wave has loaded its model, so that none times a layer while
    another is still starting (importing torch is seconds; a small model's profile is seconds too)."""
    (meet / f"ready-{index}").touch()
    deadline = time.monotonic() + MEET_TIMEOUT_S
    while not _all_there(meet, "ready", together) and time.monotonic() < deadline:
        time.sleep(0.01)


def _busy_until_all_done(meet: Path, index: int, together: int, model, device: str) -> None:
    """Train steps of the model until every process of the wave is done: the ones still timing keep a
    busy neighbour to the end, as a plan's other units stay busy."""
    import torch

    from heterps_cli.profiling.timing import step_times

    torch.set_num_threads(1)  # one unit, as the layers were timed
    (meet / f"done-{index}").touch()
    deadline = time.monotonic() + MEET_TIMEOUT_S
    while not _all_there(meet, "done", together) and time.monotonic() < deadline:
        step_times(model, device, 1, warmup=0)


def _paired(measured: Profiled, model, args: dict) -> Profiled:
    """``measured`` with the all-reduce latency its pair timed (:mod:`.replicas`), where the link was
    measured (a given ``--link-gbps`` has none) and the process has a partner."""
    from heterps_cli.profiling.replicas import paired_latency
    from heterps_cli.runtime.synthetic import output_loss

    if measured.all_reduce_latency is None or args.get("port") is None:
        return measured
    latency = paired_latency(
        model,
        args["device"],
        output_loss(measured.loss, measured.batch_size),
        measured.bandwidth,
        port=args["port"],
        index=args["index"],
        together=args["together"],
    )
    if latency is None:
        return measured
    return dataclasses.replace(measured, all_reduce_latency=latency, notes=[*measured.notes, PAIRED])


def _finished(i: int, processes: int, done: subprocess.CompletedProcess) -> None:
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        raise InputError(
            None,
            None,
            "MODEL",
            f"profiling process {i + 1} of {processes} failed: "
            f"{lines[-1] if lines else f'exit code {done.returncode}'}",
        )


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
            forward=None if layer.forward is None else median(r.layers[i].forward or 0.0 for r in runs),
            update=median(r.layers[i].update for r in runs),
        )
        for i, layer in enumerate(first.layers)
    ]
    notes = list(dict.fromkeys(note for run in runs for note in run.notes))
    notes.append(f"oct, forward, odt, alpha and update: the median over {len(runs)} profiles, each in a fresh process")
    return dataclasses.replace(
        first,
        layers=layers,
        step=median(r.step for r in runs),
        bandwidth=median(r.bandwidth for r in runs),
        notes=notes,
        pass_start=median(r.pass_start for r in runs),
        all_reduce_latency=_median_given([r.all_reduce_latency for r in runs]),
        transfer_latency=_median_given([r.transfer_latency for r in runs]),
    )


def _median_given(values: list[float | None]) -> float | None:
    given = [v for v in values if v is not None]
    return float(statistics.median(given)) if given else None


def from_dict(data: dict) -> Profiled:
    load = Load(**data["load"]) if data.get("load") else None
    ties = [Tie(**{**t, "holders": tuple(tuple(h) for h in t["holders"])}) for t in data.get("ties", [])]
    layers = [LayerProfile(**layer) for layer in data["layers"]]
    return Profiled(**{**data, "layers": layers, "load": load, "ties": ties})


def _worker(args: dict, out: Path) -> int:
    try:
        model = load_model(
            args["spec"],
            args["batch_size"],
            tuple(args["input_shape"]) if args["input_shape"] else None,
            args["granularity"],
        )
        meet = Path(args["meet"]) if args.get("meet") else None
        if meet is not None:
            _meet(meet, args["index"], args["together"])
        measured = measure(
            model,
            args["resource"],
            device=args["device"],
            repetitions=args["repetitions"],
            link_gbps=args["link_gbps"],
            link=Link(**args["link"]) if args.get("link") else None,
            loss=args.get("loss", "mse"),
            optimizer=args.get("optimizer", "sgd"),
            precision=args.get("precision"),
        )
        if meet is not None:  # the pairs meet once every process is done: none waits idle beside one timing
            _busy_until_all_done(meet, args["index"], args["together"], model, args["device"])
            measured = _paired(measured, model, args)
    except InputError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    out.write_text(json.dumps(dataclasses.asdict(measured)))
    return 0


if __name__ == "__main__":
    sys.exit(_worker(json.loads(sys.argv[1]), Path(sys.argv[2])))
