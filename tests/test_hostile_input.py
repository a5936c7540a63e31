"""Hostile and careless input files and options: malformed or hostile YAML, overflowing numbers,
misleading or missing keys (docs/spec.md section 5). Bad input ends with `file:line: field: message`
lines and exit 2, never a traceback."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from heterps_cli.cli.app import app
from heterps_cli.figures import count, duration, usd
from tests.helpers import ROOT, no_traceback, refused

HOSTILE = Path(__file__).parent / "data" / "hostile"
CTR, PAPER = str(ROOT / "profiles/ctr.yaml"), str(ROOT / "clusters/paper.yaml")


HOSTILE_CASES = {
    "binary.yaml": "binary.yaml:3: control character U+0000 at column 1",
    "recursive_alias.yaml": "recursive_alias.yaml:3: layers[0]: recursive alias",
    "deep_nesting.yaml": "deep_nesting.yaml:3: refused: nesting too deep",
    "billion_laughs.yaml": "aliases expand to more than 100,000 nodes",
    "python_object.yaml": "python_object.yaml:1: not valid YAML: could not determine a constructor for the tag",
    "non_utf8.yaml": "non_utf8.yaml:1: not UTF-8 text: byte 0xe9 at offset 10",
    "tabs.yaml": "(indent with spaces: YAML does not allow tabs there)",
}


# the alias bomb takes a second a command to refuse: the slow run asks all three, the fast one the loader below
@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n == "billion_laughs.yaml" else n for n in HOSTILE_CASES]
)
def test_hostile_yaml_is_refused_with_its_position(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a python/object tag that ran would leave a file here
    path = str(HOSTILE / name)
    for args in (["validate", path], ["plan", path, PAPER, "-s", "exact"], ["validate", CTR, path]):
        refused(args, HOSTILE_CASES[name])
    assert not list(tmp_path.iterdir()), "nothing was executed"


@pytest.mark.parametrize("name", HOSTILE_CASES)
def test_the_pure_python_loader_refuses_them_too(name, monkeypatch):
    from heterps_cli import yamlio

    monkeypatch.setattr(yamlio, "_LOADERS", [yamlio._Loader])  # as on a machine without libyaml
    refused(["validate", str(HOSTILE / name)], HOSTILE_CASES[name].split(": ", 1)[-1][:40])


def test_a_file_over_64_mib_is_refused_before_parsing(tmp_path):
    huge = tmp_path / "huge.yaml"
    with open(huge, "wb") as fh:
        fh.truncate((64 << 20) + 1)  # sparse: costs no disk and no time to make
    refused(["validate", str(huge)], "huge.yaml: file is over 64 MiB")


def test_yaml_1_2_numbers_never_read_as_other_numbers(runner, tmp_path):
    text = Path(CTR).read_text().replace("batch_size: 4096", "batch_size: 0100", 1)
    (tmp_path / "p.yaml").write_text(text)
    result = runner.invoke(app, ["validate", str(tmp_path / "p.yaml")])
    assert result.exit_code == 0 and "batch size 100" in result.stdout, result.output  # YAML 1.1 read 64
    (tmp_path / "p.yaml").write_text(text.replace("batch_size: 0100", "batch_size: 1:04", 1))
    refused(["validate", str(tmp_path / "p.yaml")], "batch_size: must be a whole number (got str '1:04')")
    (tmp_path / "p.yaml").write_text(text.replace("model: ctr", "model: yes", 1))
    result = runner.invoke(app, ["validate", str(tmp_path / "p.yaml")])
    assert result.exit_code == 0 and "model yes" in result.stdout, result.output  # a string, not True


# -- numbers that overflow --------------------------------------------------------------


def test_a_job_whose_cost_overflows_is_bad_input_naming_the_settings():
    refused(
        ["plan", CTR, PAPER, "--samples", "1e10", "--epochs", "1e308", "--scheduler", "exact"],
        "samples x epochs: ",
        "would overflow",
    )
    refused(
        ["plan", CTR, PAPER, "--samples", "1e10", "--epochs", "1e308", "--scheduler", "exact", "--json"],
        "would overflow",
    )


def test_a_job_size_in_the_profile_that_overflows_names_the_profile_line(tmp_path):
    text = Path(CTR).read_text()
    samples_line = next(i for i, line in enumerate(text.splitlines(), 1) if line.strip().startswith("samples:"))
    (tmp_path / "p.yaml").write_text(
        re.sub(r"samples: \S+", "samples: 1.7e308", text, count=1).replace("epochs: 1", "epochs: 10", 1)
    )
    refused(["plan", str(tmp_path / "p.yaml"), PAPER, "-s", "exact"], f"p.yaml:{samples_line}: job.samples x ")


@pytest.mark.parametrize(
    "flag,value",
    [
        ("--min-throughput", "inf"),
        ("--max-cost", "inf"),
        ("--samples", "nan"),
        ("--epochs", "inf"),
        ("--samples", "-1"),
        ("--seed", "-1"),
        ("--seed", str(2**64)),
    ],
)
def test_non_finite_options_are_refused(runner, flag, value):
    result = runner.invoke(app, ["plan", CTR, PAPER, "-s", "exact", flag, value])
    assert result.exit_code == 2 and flag in result.output, result.output
    no_traceback(result)


def test_huge_but_finite_figures_print_short_and_json_stays_json(runner):
    result = runner.invoke(
        app, ["plan", CTR, PAPER, "--samples", "1e10", "--epochs", "1e280", "-s", "exact"], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 0, result.output
    assert re.search(r"cost +\$\d\.\d+e\+\d+", result.stdout) and "years" in result.stdout, result.stdout
    assert max(len(line) for line in result.stdout.splitlines()) < 200
    result = runner.invoke(app, ["plan", CTR, PAPER, "--samples", "1e10", "--epochs", "1e280", "-s", "exact", "--json"])

    def refuse(constant):
        raise AssertionError(f"{constant} is not JSON")

    plan = json.loads(result.stdout, parse_constant=refuse)
    assert plan["cost_usd"] > 1e280


def test_small_costs_keep_significant_digits(runner):
    assert usd(0.0031) == "$0.0031" and usd(0.8) == "$0.80" and usd(1234.5) == "$1,234.50"
    assert usd(8.02e-7) == "$8.02e-07" and usd(0) == "$0.00" and usd(3.3e20) == "$3.3e+20"
    assert count(1326102.8) == "1,326,103" and count(2e20) == "2e+20"
    assert (
        duration(28) == "28.0 s"
        and duration(4710.1) == "79 min"
        and duration(9000) == "2 h 30 min"
        and "years" in duration(1e300)
    )
    result = runner.invoke(app, ["plan", CTR, PAPER, "-s", "exact", "--samples", "35000000"])
    assert result.exit_code == 0, result.output
    cost = re.search(r"^cost +(\S+)", result.stdout, flags=re.M).group(1)
    assert cost.startswith("$0.0") and cost != "$0.00" and len(cost.rstrip("0")) >= 5, cost


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("limit", 10**400, "resources.cpu.limit: must be <= 1,000,000,000"),
        ("limit", 9 * 10**18, "resources.cpu.limit: must be <= 1,000,000,000"),
        ("price", 1e400, "resources.cpu.price: must be a finite number"),
    ],
)
def test_numbers_past_what_the_model_can_use_are_refused(tmp_path, field, value, message):
    cluster = yaml.safe_load(Path(PAPER).read_text())
    cluster["resources"]["cpu"][field] = value
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cluster).replace("inf", "1e400"))
    refused(["plan", CTR, str(tmp_path / "c.yaml"), "-s", "greedy"], message)


# -- output files -----------------------------------------------------------------------


def test_did_you_mean_suggests_only_a_different_valid_key(tmp_path):
    (tmp_path / "c.yaml").write_text("name: mine\nresources:\n  cpu: {price: 0.04, limit: 8}\n")
    stderr = refused(
        ["validate", CTR, str(tmp_path / "c.yaml")], "c.yaml:1: name: unknown field 'name'; did you mean 'cluster'?"
    )
    assert "did you mean 'name'" not in stderr and "required field is missing" not in stderr
    (tmp_path / "c.yaml").write_text("cluster: c\nresources:\n  cpu: {price: 0.04, limit: 8, layers: 3}\n")
    stderr = refused(["validate", CTR, str(tmp_path / "c.yaml")], "resources.cpu.layers: unknown field 'layers'")
    assert "did you mean 'layers'" not in stderr


@pytest.mark.parametrize(
    "args,message",
    [
        (["check", CTR, "--profile", CTR, "--cluster", PAPER], "this is a model profile, not a plan"),
        (
            ["check", str(ROOT / "docs/plans/ctr.yaml"), "--profile", PAPER, "--cluster", PAPER],
            "this is a cluster, not a model profile",
        ),
        (
            ["validate", CTR, CTR],
            f"ctr.yaml:{Path(CTR).read_text().splitlines().index('layers:') + 1}: "
            "this is a model profile, not a cluster",
        ),
        (["plan", str(ROOT / "docs/plans/ctr.yaml"), PAPER], "this is a plan, not a model profile"),
        (["diff", CTR, str(ROOT / "docs/plans/ctr.yaml")], "this is a model profile, not a plan"),
    ],
)
def test_a_file_of_the_wrong_kind_is_named_as_such(args, message):
    refused(args, message)


def _broken_profile(tmp_path, n_bad: int) -> str:
    data = yaml.safe_load(Path(CTR).read_text())
    for i in range(n_bad):
        layer = data["layers"][i % len(data["layers"])]
        layer["times"]["cpu"]["oct"] = -1 - i // len(data["layers"])
        if i >= len(data["layers"]):
            layer[f"typo{i}"] = 1
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return str(tmp_path / "p.yaml")


def test_every_problem_in_both_files_is_shown_at_once(tmp_path):
    profile = _broken_profile(tmp_path, 3)
    (tmp_path / "c.yaml").write_text("cluster: c\nresources:\n  cpu: {price: -1, limit: 8}\n")
    for command in (["validate", profile, str(tmp_path / "c.yaml")], ["plan", profile, str(tmp_path / "c.yaml")]):
        lines = refused(command).strip().splitlines()
        assert len(lines) == 4, lines
        assert all(re.match(r"error: \S+\.yaml:\d+: \S+: ", line) for line in lines), lines
        assert sum("times.cpu.oct: must be > 0" in line for line in lines) == 3
        assert "c.yaml:3: resources.cpu.price: must be >= 0" in lines[-1]


def test_at_most_twenty_problems_and_a_count_of_the_rest(tmp_path):
    lines = refused(["validate", _broken_profile(tmp_path, 25)]).strip().splitlines()
    assert len(lines) == 21 and lines[-1] == "error: … and 5 more problems", lines


def test_a_40_kb_name_is_refused_not_rendered(tmp_path):
    text = Path(CTR).read_text().replace("name: fc1", "name: " + "x" * 40_000, 1)
    (tmp_path / "p.yaml").write_text(text)
    stderr = refused(
        ["plan", str(tmp_path / "p.yaml"), PAPER, "-s", "exact"], "name: must be at most 256 characters (got 40,000)"
    )
    assert len(stderr) < 400  # the value is cut short in the message too


def test_names_alike_in_unicodes_compatibility_form_are_refused_in_a_file_and_across_files(tmp_path):
    """'ｖ100' (a full-width letter) and 'v100' differ byte for byte and in NFC, and read as one name."""
    cluster = yaml.safe_load((ROOT / "clusters/paper.yaml").read_text())
    cluster["resources"]["\uff56100"] = dict(cluster["resources"]["v100"])
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cluster, allow_unicode=True))
    shown = refused(["validate", str(ROOT / "profiles/ctr.yaml"), str(tmp_path / "c.yaml")], "resources.\uff56100")
    assert "is 'v100' (line" in shown and "Unicode NFKC" in shown
    profile = yaml.safe_load((ROOT / "profiles/ctr.yaml").read_text())
    for layer in profile["layers"]:
        layer["times"]["\uff56100"] = layer["times"].pop("v100")
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(profile, allow_unicode=True))
    for command in ("validate", "plan"):
        shown = refused([command, str(tmp_path / "p.yaml"), str(ROOT / "clusters/paper.yaml")], "Unicode NFKC")
        assert "the profile's type '\uff56100' is the cluster's 'v100'" in shown


def test_keys_that_are_one_once_read_are_duplicates(tmp_path):
    """`1` and `01` are one number: PyYAML kept the last of them, silently."""
    entry = "      cpu: {oct: 0.0341, odt: 0.09656, alpha: 0.999, beta: 1.0"
    twice = ", batches: {8: {oct: 1, odt: 0}, 08: {oct: 2, odt: 0}}"
    profile = (ROOT / "profiles/ctr.yaml").read_text().replace(entry + "}", entry + twice + "}")
    (tmp_path / "p.yaml").write_text(profile)
    refused(["validate", str(tmp_path / "p.yaml")], "duplicate key", "as the same int")
