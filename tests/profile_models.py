"""The small models the profile tests measure, as the user's file of factories they write."""

FACTORY = """
import torch
from torch import nn

def small(batch_size=32):
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 8))
    return model, torch.randn(batch_size, 64)

def module_only():
    return nn.Sequential(nn.Linear(16, 16), nn.ReLU())

def raises(batch_size):
    x = 1
    raise ValueError("no weights here")

def wrong():
    return "a string"

class Broken(nn.Module):
    def forward(self, x):
        raise RuntimeError("shapes do not match")

def broken_forward(batch_size=4):
    return Broken(), torch.randn(batch_size, 4)

class BrokenElsewhere(nn.Linear):  # fails only in a process other than the test's: a profiling process
    def forward(self, x):
        import os
        if os.getpid() != int(os.environ["HETERPS_TEST_PID"]):
            raise RuntimeError("shapes do not match")
        return super().forward(x)

def broken_elsewhere(batch_size=4):
    return nn.Sequential(BrokenElsewhere(4, 4)), torch.randn(batch_size, 4)

class Clocked(nn.Linear):  # appends when each forward ran to a file named for its process
    def forward(self, x):
        import os, time
        with open(os.path.join(os.environ["HETERPS_TEST_CLOCKS"], str(os.getpid())), "a") as f:
            f.write(f"{time.time()} ")
        return super().forward(x)

class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(1))

    def forward(self, x):
        return x * self.w

def wide_output(batch_size=8):  # a cheap last layer over 400,000 outputs a sample: the loss is most of its time
    return nn.Sequential(Scaled(), nn.Flatten()), torch.randn(batch_size, 4, 100_000)

def clocked(batch_size=8):
    return nn.Sequential(Clocked(32, 32), nn.ReLU()), torch.randn(batch_size, 32)
"""
