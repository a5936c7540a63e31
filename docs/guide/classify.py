"""A training task for ``heterps run --task`` (docs/guide/training.md): a small classifier trained with Adam
on a dataset read from disk.

``model`` is what ``heterps profile docs/guide/classify.py:model`` measures; ``task`` is what ``heterps run
PLAN --task docs/guide/classify.py:task`` trains. The data are generated once (4,096 samples of 32 features
in 4 classes, seeded) and saved as two ``.npy`` files in ``$CLASSIFY_DATA`` (default
``~/.cache/heterps/classify``); the dataset reads them back, many samples in one read. Every process calls
``task()``: the files are written under temporary names and renamed, so processes that start together
never read half a file.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

from heterps_cli import Task

FEATURES, CLASSES, SAMPLES = 32, 4, 4096


def data_dir() -> Path:
    return Path(os.environ.get("CLASSIFY_DATA", Path.home() / ".cache" / "heterps" / "classify"))


def make_data(root: Path) -> None:
    """The dataset's files, unless they are there: points around one random centre per class."""
    if (root / "features.npy").is_file() and (root / "labels.npy").is_file():
        return
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(CLASSES, FEATURES)) * 1.5
    labels = rng.integers(0, CLASSES, SAMPLES)
    features = (centres[labels] + rng.normal(size=(SAMPLES, FEATURES))).astype(np.float32)
    for name, array in (("labels", labels), ("features", features)):  # features last: its presence means both
        partial = root / f".{name}.{os.getpid()}.npy"
        np.save(partial, array)
        os.replace(partial, root / f"{name}.npy")


class Files(Dataset):
    """The saved samples, read from disk (memory-mapped) one at a time: ``(features, label)``."""

    def __init__(self, root: Path):
        self.features = np.load(root / "features.npy", mmap_mode="r")
        self.labels = np.load(root / "labels.npy", mmap_mode="r")

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.from_numpy(np.array(self.features[i])), int(self.labels[i])

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Many samples in one read of each file, as a batch: ``heterps run`` takes it as it is, where
        collating sample by sample costs this small model's stage half its compute."""
        return torch.from_numpy(self.features[indices]), torch.from_numpy(self.labels[indices])


def network() -> nn.Sequential:
    return nn.Sequential(nn.Linear(FEATURES, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, CLASSES))


def model(batch_size: int = 64):
    """What ``heterps profile`` measures: the network and an example batch."""
    return network(), torch.randn(batch_size, FEATURES)


def task() -> Task:
    """What ``heterps run --task`` trains: the same network, the files, cross-entropy and Adam."""
    make_data(data_dir())
    return Task(
        model=network(),
        data=Files(data_dir()),
        loss=nn.functional.cross_entropy,
        optimizer=lambda params: torch.optim.Adam(params, lr=1e-3),
    )
