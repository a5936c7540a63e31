"""The bundled examples are what their generator says, and carry their provenance."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from tests.helpers import ROOT


def _generator():
    spec = importlib.util.spec_from_file_location("make_examples", ROOT / "profiles/make_examples.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", ["ctr", "vgg16", "transformer"])
def test_bundled_profile_matches_its_generator(name):
    assert (ROOT / f"profiles/{name}.yaml").read_text() == _generator().render(name), (
        f"profiles/{name}.yaml is stale: run python profiles/make_examples.py"
    )


@pytest.mark.parametrize(
    "path",
    sorted((ROOT / "clusters").glob("*.yaml")) + sorted((ROOT / "profiles").glob("*.yaml")),
    ids=lambda p: p.name,
)
def test_every_example_says_where_its_numbers_come_from(path):
    head = path.read_text().split("\n", 6)[:6]
    assert any(line.startswith("#") for line in head)
    assert any(word in path.read_text() for word in ("estimated", "paper", "instance catalogue"))
