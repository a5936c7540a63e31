"""`heterps validate`: a short summary of good files; errors as for `plan`."""

from __future__ import annotations

from heterps_cli.cli.app import app
from heterps_cli.yamlio import load_yaml
from tests.helpers import ROOT


def test_summary_of_a_profile_and_cluster(runner):
    result = runner.invoke(
        app, ["validate", str(ROOT / "profiles/ctr.yaml"), str(ROOT / "clusters/paper.yaml")], env={"COLUMNS": "160"}
    )
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "model ctr, 10 layers, batch size 4096" in out
    assert "10/10: 0-9" in out  # which layers each type can run
    assert "0.7982" in out  # total OCT of the cpu column, summed from the file
    assert "ignored when planning: a100" in out


def test_summary_of_a_profile_alone(runner, tmp_path):
    text = (ROOT / "profiles/ctr.yaml").read_text()
    # fc1 (layer 2) and relu1 (layer 3) timed on cpu only: v100 then runs 0-1, 4-9
    lines = text.splitlines()
    out, layer = [], -1
    for line in lines:
        if line.startswith("  - name:"):
            layer += 1
        if layer in (2, 3) and line.strip().startswith(("v100:", "a100:")):
            continue
        out.append(line)
    (tmp_path / "p.yaml").write_text("\n".join(out) + "\n")
    result = runner.invoke(app, ["validate", str(tmp_path / "p.yaml")], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    assert "8/10: 0-1, 4-9" in result.stdout


def test_a_profiles_fixed_costs_are_summarised(runner, tmp_path):
    text = (
        (ROOT / "profiles/ctr.yaml")
        .read_text()
        .replace(
            "layers:\n",
            "fixed:\n  v100: {pass_start: 2.0e-4, all_reduce_latency: 5.0e-4, transfer_latency: 1.0e-4}\nlayers:\n",
            1,
        )
    )
    (tmp_path / "p.yaml").write_text(text)
    result = runner.invoke(app, ["validate", str(tmp_path / "p.yaml")], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert (
        "fixed costs per stage (docs/spec.md section 1d, with a global batch): v100 pass start 0.0002 s, "
        "all-reduce latency 0.0005 s, transfer latency 0.0001 s" in result.stdout
    )


def test_yaml_12_floats_and_lines(tmp_path):
    doc_path = tmp_path / "floats.yaml"
    doc_path.write_text("a: 4.2e9\nb: 1e-3\nc:\n  - x: 1\n    y: 'z'\n")
    doc = load_yaml(doc_path)
    assert doc.data == {"a": 4.2e9, "b": 1e-3, "c": [{"x": 1, "y": "z"}]}
    assert doc.line(("c", 0, "y")) == 5 and doc.line(("c", 0, "missing")) == 4


def test_a_cluster_alone_is_checked_and_summarised(runner, tmp_path):
    result = runner.invoke(app, ["validate", str(ROOT / "clusters/paper-hardware.yaml")], env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    assert "cluster paper-hardware, 2 resource types" in result.stdout
    assert "CPU core" in result.stdout and "12.5" in result.stdout and "not given" not in result.stdout
    result = runner.invoke(app, ["validate", str(ROOT / "clusters/paper.yaml")], env={"COLUMNS": "120"})
    assert result.exit_code == 0 and "memory is not checked" in result.stdout
    bad = tmp_path / "c.yaml"
    bad.write_text("cluster: x\nresources:\n  cpu: {price: -1, limit: 4}\n")
    result = runner.invoke(app, ["validate", str(bad)])
    assert result.exit_code == 2 and f"{bad}:3" in result.stderr and "price" in result.stderr


def test_a_plan_alone_is_checked_and_summarised(runner, tmp_path):
    result = runner.invoke(app, ["validate", str(ROOT / "docs/plans/ctr.yaml")], env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    assert "a plan of ctr on paper by exact, 3 stages: cpu×34 | v100×1 | cpu×1" in result.stdout
    assert "heterps check" in result.stdout
    bad = tmp_path / "p.yaml"
    bad.write_text((ROOT / "docs/plans/ctr.yaml").read_text().replace("replicas: 34", "replicas: -34"))
    result = runner.invoke(app, ["validate", str(bad)])
    assert result.exit_code == 2 and "replicas" in result.stderr and "Traceback" not in result.output


def test_the_package_lists_its_public_names():
    import heterps_cli

    assert dir(heterps_cli) == sorted(heterps_cli.__all__)
    assert "STARTED" not in dir(heterps_cli) and "load_problem" in dir(heterps_cli)


def test_plot_to_a_terminal_is_refused(monkeypatch):
    import sys

    monkeypatch.setattr(sys.stdout, "isatty", lambda: True, raising=False)
    from heterps_cli.cli import app as cli

    try:
        cli._one_stdout(False, "-")
    except Exception as exc:  # typer.BadParameter: exit 2 with the option named
        assert "terminal" in str(exc)
    else:
        raise AssertionError("--plot - on a terminal was accepted")
    cli._one_stdout(False, "picture.png")


def test_validate_refuses_a_cluster_that_plan_refuses(runner, tmp_path):
    """A type without a price (and no nodes), or a reserve above the memory: validate said it was
    fine, then failed inside its own table; it now gives plan's error."""
    for text, where in (
        ("cluster: x\nresources:\n  cpu: {limit: 3}\n", "resources.cpu"),
        (
            "cluster: x\nresources:\n  v100: {price: 1, limit: 2, memory_gb: 16, memory_reserved_gb: 20}\n",
            "resources.v100.memory_reserved_gb",
        ),
    ):
        path = tmp_path / "c.yaml"
        path.write_text(text)
        result = runner.invoke(app, ["validate", str(path)])
        assert result.exit_code == 2, result.output
        assert f"c.yaml:3: {where}" in result.output and "internal error" not in result.output


def test_a_plan_is_checked_against_a_cluster_it_names_types_units_and_nodes_of(runner):
    """validate PLAN CLUSTER, as the README lists it: said "this is a plan, not a model profile" before."""
    ctr, placed = str(ROOT / "docs/plans/ctr.yaml"), str(ROOT / "docs/plans/ctr-aws-p3.yaml")
    paper, nodes = str(ROOT / "clusters/paper.yaml"), str(ROOT / "clusters/aws-p3-nodes.yaml")
    for plan, cluster in ((ctr, paper), (placed, nodes)):
        result = runner.invoke(app, ["validate", plan, cluster])
        shown = " ".join(result.output.split())
        assert result.exit_code == 0 and f"well-formed, on types, units and nodes {cluster} has" in shown, shown
    workstation = str(ROOT / "clusters/workstation.yaml")  # cpu (2 cores) and a100: no v100
    result = runner.invoke(app, ["validate", ctr, workstation])
    shown = " ".join(result.output.split())
    assert result.exit_code == 2 and "stages[1].resource: 'v100' is no type of" in shown
    assert "uses 35 units of cpu, more than its limit of 2" in shown
    result = runner.invoke(app, ["validate", ctr, nodes])
    assert result.exit_code == 2 and "rents whole nodes, and the plan says none" in " ".join(result.output.split())
