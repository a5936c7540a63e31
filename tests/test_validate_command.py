"""`heterps validate`: a short summary of good files; errors as for `plan`."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from heterps_cli.cli.app import app
from heterps_cli.yamlio import load_yaml

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def test_summary_of_a_profile_and_cluster():
    result = runner.invoke(
        app, ["validate", str(ROOT / "profiles/ctr.yaml"), str(ROOT / "clusters/paper.yaml")], env={"COLUMNS": "160"}
    )
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "model ctr, 10 layers, batch size 4096" in out
    assert "10/10: 0-9" in out  # which layers each type can run
    assert "0.7982" in out  # total OCT of the cpu column, summed from the file
    assert "ignored when planning: a100" in out


def test_summary_of_a_profile_alone(tmp_path):
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


def test_yaml_12_floats_and_lines(tmp_path):
    doc_path = tmp_path / "floats.yaml"
    doc_path.write_text("a: 4.2e9\nb: 1e-3\nc:\n  - x: 1\n    y: 'z'\n")
    doc = load_yaml(doc_path)
    assert doc.data == {"a": 4.2e9, "b": 1e-3, "c": [{"x": 1, "y": "z"}]}
    assert doc.line(("c", 0, "y")) == 5 and doc.line(("c", 0, "missing")) == 4
