"""Shared test helpers: build profile/cluster mappings, files and problems from arrays."""

from __future__ import annotations

import numpy as np
import yaml

from heterps_cli.formats import Cluster, Profile
from heterps_cli.problem import Problem, build_problem


def instance_dicts(oct_, odt, alpha, beta, runnable, prices, limits, B0=32, samples=1e6, min_throughput=0.0):
    n, T = oct_.shape
    types = [f"r{t}" for t in range(T)]
    layers = []
    for layer in range(n):
        times = {
            types[t]: {
                "oct": float(oct_[layer, t]),
                "odt": float(odt[layer, t]),
                "alpha": float(alpha[layer, t]),
                "beta": float(beta[layer, t]),
            }
            for t in range(T)
            if runnable[layer, t]
        }
        layers.append({"name": f"l{layer}", "type": "fc", "input_size": 4.0, "weight_size": 4.0, "times": times})
    profile = {
        "model": "generated",
        "batch_size": int(B0),
        "job": {"samples": float(samples), "epochs": 1.0, "min_throughput": float(min_throughput)},
        "layers": layers,
    }
    cluster = {
        "cluster": "generated",
        "resources": {types[t]: {"price": float(prices[t]), "limit": int(limits[t])} for t in range(T)},
    }
    return profile, cluster


def problem_from_dicts(profile: dict, cluster: dict, **options) -> Problem:
    return build_problem(Profile.model_validate(profile), Cluster.model_validate(cluster), **options)


def write_yaml(path, data) -> str:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def random_instance(rng: np.random.Generator, n: int, T: int, max_limit: int = 5):
    """A random small instance as arrays; every layer runs on at least one type."""
    oct_ = np.exp(rng.uniform(np.log(1e-3), np.log(1.0), (n, T)))
    odt = np.where(rng.random((n, T)) < 0.2, 0.0, np.exp(rng.uniform(np.log(1e-4), np.log(1.0), (n, T))))

    def fraction():
        return np.select([rng.random((n, T)) < 0.15, rng.random((n, T)) < 0.15], [0.0, 1.0], rng.random((n, T)))

    alpha, beta = fraction(), fraction()
    runnable = rng.random((n, T)) < 0.8
    runnable[np.arange(n), rng.integers(0, T, n)] = True
    runnable[rng.integers(0, n, T), np.arange(T)] = True  # every type runs something (none is dropped)
    prices = np.where(rng.random(T) < 0.1, 0.0, rng.uniform(0.01, 5.0, T)).round(4)
    limits = rng.integers(1, max_limit + 1, T)
    return oct_, odt, alpha, beta, runnable, prices, limits
