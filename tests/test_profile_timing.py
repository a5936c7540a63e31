"""The layer timer of `heterps profile`: step order, each layer's own backward, the alpha fit over
replicas' shares, layer kinds and the bytes two layers save once."""

from __future__ import annotations

import time

import pytest
import torch

from heterps_cli.profiling import measure, models, timing


def test_layer_kinds_from_module_classes():
    from torch import nn

    cases = {
        nn.Linear(2, 2): "fc",
        nn.Conv2d(1, 1, 1): "conv",
        nn.EmbeddingBag(4, 2): "embedding",
        nn.MaxPool2d(2): "pool",
        nn.ReLU(): "activation",
        nn.LayerNorm(2): "norm",
        nn.MultiheadAttention(4, 1): "attention",
        nn.Dropout(): "dropout",
        nn.MSELoss(): "loss",
        nn.Flatten(): "flatten",
    }
    assert {models.kind(m): k for m, k in cases.items()} == {k: k for k in cases.values()}


def test_alpha_fit_recovers_a_known_fraction_and_refuses_nonsense():
    for alpha in (0.0, 0.3, 0.9):
        threads = [1, 2, 3, 4]
        times = [0.01 * (1 - alpha + alpha / k) for k in threads]
        fitted, residual = timing.fit_alpha(threads, times)
        assert fitted == pytest.approx(alpha, abs=1e-9) and residual < 1e-9
    assert timing.fit_alpha([1], [0.01]) is None  # one core: nothing to fit
    assert timing.fit_alpha([1, 2], [0.0, 1e-6]) is None  # no time at all
    assert timing.fit_alpha([1, 2, 3], [0.01, 0.03, 0.005]) is None  # no Amdahl curve
    # A small layer whose time grows a little at smaller shares (docs/guide/classify.py's first layer, measured:
    # 0.109, 0.125, 0.114 ms at 64, 32, 16 samples): a good fit below 0, which is 0, not a default.
    fitted, residual = timing.fit_alpha([1, 2, 4], [0.109e-3, 0.125e-3, 0.114e-3])
    assert fitted == 0.0 and residual < 0.10
    fitted, _ = timing.fit_alpha([1, 2, 4], [0.01, 0.0049, 0.0024])  # a share saves a little more than itself
    assert fitted == 1.0
    # The guide's ReLU, tens of microseconds (measured: 0.0636, 0.0528, 0.049 ms at 64, 32, 16 samples): its
    # time barely shrinks, which is what its alpha says (the kind's default of 0.8 promised replicas more).
    fitted, residual = timing.fit_alpha([1, 2, 4], [63.6e-6, 52.8e-6, 49.0e-6])
    assert fitted == pytest.approx(0.31, abs=0.02) and residual < 0.10


class _Clock:
    """The host clock timing reads (``timing.time``), moved only by the layers below: a layer's measured
    time is what it says it takes, whatever the machine's load."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def __getattr__(self, name):
        return getattr(time, name)


CLOCK = _Clock()  # the known times below move it; the tests that read it put it in timing's place


class _Takes(torch.nn.Module):
    """A layer whose time is known: ``fixed`` seconds, plus ``per_sample`` seconds per sample of its input,
    on ``clock``."""

    def __init__(self, clock: _Clock, fixed: float, per_sample: float, needs: int | None = None):
        super().__init__()
        self.clock, self.fixed, self.per_sample, self.needs = clock, fixed, per_sample, needs
        self.weight = torch.nn.Parameter(torch.ones(2))

    def forward(self, x):
        if self.needs is not None and x.shape[0] != self.needs:
            raise ValueError(f"this layer takes batches of {self.needs}")
        self.clock.now += self.fixed + self.per_sample * x.shape[0]
        return x * self.weight


def _alpha_of(layer: torch.nn.Module, batch: int) -> measure.LayerProfile:
    call = models.Call("0", layer, (torch.ones(batch, 2),), {})
    shares = measure._share_times([call], "cpu", batch, [])
    return measure._layer(call, batch, [0.02], 1e9, "cpu", {k: times[0] for k, times in shares.items()})


def test_alpha_is_fitted_over_the_batch_shares_that_replicas_run(monkeypatch):
    clock = CLOCK
    monkeypatch.setattr(timing, "time", clock)
    # T(b) = 4 ms + 1 ms per sample: at 16 samples 20 ms, of which 16 ms divide between replicas
    fitted = _alpha_of(_Takes(clock, 0.004, 0.001), 16)
    assert fitted.alpha == pytest.approx(0.8, abs=1e-6) and "alpha" not in fitted.estimated
    odd = _alpha_of(_Takes(clock, 0.004, 0.001), 3)  # 3 samples: no share of 2 or 4 replicas
    assert odd.alpha == measure.ALPHA_OTHER and "cannot be split" in odd.estimated["alpha"]
    fixed = _alpha_of(_Takes(clock, 0.004, 0.001, needs=16), 16)  # the user's layer refuses a smaller batch
    assert "failed on a share of the batch (ValueError)" in fixed.estimated["alpha"]


class _Logged(torch.nn.Module):
    """Logs ("forward", name, samples) and ("backward", name) to ``log``; refuses fewer than ``least`` samples."""

    def __init__(self, name: str, log: list, least: int = 0):
        super().__init__()
        self.name, self.log, self.least = name, log, least
        self.weight = torch.nn.Parameter(torch.ones(2))

    def forward(self, x):
        if x.shape[0] < self.least:
            raise ValueError(f"this layer takes {self.least} samples at least")
        self.log.append(("forward", self.name, x.shape[0]))
        y = x * self.weight
        y.register_hook(lambda grad: self.log.append(("backward", self.name)))
        return y


def test_layers_are_timed_in_step_order_and_a_refused_share_spares_the_others():
    log: list = []
    calls = [models.Call(n, _Logged(n, log, least=8 if n == "b" else 0), (torch.ones(8, 2),), {}) for n in "abc"]
    times = timing.step_order_times(calls, "cpu", repetitions=1, warmup=0)
    # every forward in the model's order, then every backward in reverse, as a training step runs them
    assert log == [("forward", "a", 8), ("forward", "b", 8), ("forward", "c", 8)] + [
        ("backward", "c"),
        ("backward", "b"),
        ("backward", "a"),
    ]
    assert all(len(t) == 1 and t[0] > 0 for t in times)
    log.clear()
    shared = timing.step_order_times(calls, "cpu", repetitions=2, warmup=0, shares=(8, 4))
    assert isinstance(shared[1], ValueError) and len(shared[0]) == len(shared[2]) == 2
    assert ("forward", "a", 4) in log and ("forward", "c", 4) in log
    with pytest.raises(ValueError):  # on the whole batch a failing layer is the profile's error
        timing.step_order_times([models.Call("b", _Logged("b", [], least=16), (torch.ones(8, 2),), {})], "cpu", 1)


class _SlowBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        CLOCK.now += 0.03
        return grad * 2


class _Slow(torch.nn.Module):
    def forward(self, x):
        return _SlowBackward.apply(x)


def test_one_backward_call_gives_each_layer_its_own_backward_time(monkeypatch):
    """All layers' backwards run in one call, as in a step; each layer's share is where its nodes ran."""
    monkeypatch.setattr(timing, "time", CLOCK)
    calls = [models.Call(n, _Slow() if n == "b" else torch.nn.Linear(2, 2), (torch.ones(8, 2),), {}) for n in "abc"]
    times = timing.step_order_times(calls, "cpu", repetitions=2, warmup=0)
    assert all(len(t) == 2 for t in times)
    assert min(times[1]) >= 0.03  # the slow backward is b's
    assert max(times[0]) < 0.015 and max(times[2]) < 0.015


class _SleepyLoss(torch.autograd.Function):
    """A loss whose forward takes 20 ms and whose backward 30 ms."""

    @staticmethod
    def forward(ctx, y):
        CLOCK.now += 0.02
        ctx.shape = y.shape
        return y.sum()

    @staticmethod
    def backward(ctx, grad):
        CLOCK.now += 0.03
        return grad.expand(ctx.shape)


def test_the_loss_a_step_takes_of_the_output_is_the_last_layers_time_and_not_its_forward(monkeypatch):
    """The run's last stage computes the loss and its backward every micro-batch: the profile charges
    both to the last layer, once (not again as a recomputed forward), and to no other layer."""
    monkeypatch.setattr(timing, "time", CLOCK)
    calls = [models.Call(n, torch.nn.Linear(2, 2), (torch.ones(8, 2),), {}) for n in "abc"]
    forwards: list[list[float]] = [[] for _ in calls]
    times = timing.step_order_times(calls, "cpu", repetitions=2, warmup=0, forwards=forwards, loss=_SleepyLoss.apply)
    assert min(times[2]) >= 0.05 and max(forwards[2]) < 0.015
    assert max(times[0]) < 0.015 and max(times[1]) < 0.015
    # on a share of the batch too (the alpha fit), and nothing for an output no loss can take
    shared = timing.step_order_times(calls, "cpu", repetitions=1, warmup=0, shares=(8, 4), loss=_SleepyLoss.apply)
    assert min(shared[2]) >= 0.05  # type: ignore[arg-type]
    assert timing.with_loss(torch.ones(3, dtype=torch.long), _SleepyLoss.apply).dtype == torch.long
    scalar = torch.ones((), requires_grad=True)
    assert timing.with_loss(scalar, _SleepyLoss.apply) is scalar
    whole = timing.timed(calls[0].module, lambda: ((torch.ones(8, 2),), {}), "cpu", 1, 0, loss=_SleepyLoss.apply)
    assert whole[0] >= 0.05  # the whole-model step the layers are held against pays it too


def test_the_synthetic_loss_is_the_runs_mean_squared_error():
    from heterps_cli.runtime.synthetic import output_loss, per_sample_loss

    y = torch.tensor([[1.0, 3.0], [2.0, 2.0]])
    # per sample: (1 + 9) / 2 = 5 and (4 + 4) / 2 = 4, over a step of 6 samples
    assert float(per_sample_loss(y, torch.zeros(2, 2), 6)) == pytest.approx(1.5)
    mse = output_loss("mse", 6)
    assert mse is not None and float(mse(y)) == pytest.approx(1.5)
    entropy = output_loss("cross-entropy", 2)  # class 0 of two equal logits: ln 2 each
    assert entropy is not None and float(entropy(torch.zeros(2, 2))) == pytest.approx(0.6931, abs=1e-4)
    assert output_loss("none", 6) is None


def test_a_tensor_two_layers_save_is_their_shared_input_saved():
    """Linear(4, 8) saves its input (4 floats a sample), the ReLU its output (8) and the next Linear its
    input, the same 8 floats: that layer's input_saved is 8 floats a sample, the others' 0."""
    from heterps_cli.profiling.measure import traced

    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    model = models.Model("tiny", module, (torch.randn(16, 4),))
    calls, _ = traced(model)
    saved = [timing.saved_bytes(call, "cpu") for call in calls]
    assert [per_batch / 16 for per_batch, _ in saved] == [4 * 4, 8 * 4, 8 * 4]
    assert [copies for _, copies in saved] == [0, 0, 0]  # fp32: a weight's transpose is the weight itself
    assert [b / 16 for b in timing.shared_with_previous(model, calls, "cpu")] == [0, 0, 8 * 4]


def test_update_is_timed_with_the_optimiser_asked_for_and_leaves_the_weights_as_they_were():
    """Adam reads and writes two moments per weight beside the weight and its gradient, SGD neither:
    its step takes several times longer (the CLI's --optimizer), and neither changes a weight."""
    torch.set_num_threads(1)
    layer = torch.nn.Linear(512, 512)
    before = [p.detach().clone() for p in layer.parameters()]
    sgd = timing.update_time(layer, "cpu", optimizer="sgd")
    adam = timing.update_time(layer, "cpu", optimizer="adam")
    assert adam > 1.5 * sgd > 0, (sgd, adam)
    assert all(torch.equal(p, b) for p, b in zip(layer.parameters(), before))
    assert all(p.grad is None for p in layer.parameters())
    assert timing.update_time(torch.nn.ReLU(), "cpu", optimizer="adam") == 0.0


class _SleepingSGD(torch.optim.SGD):
    """SGD whose step takes a known 6 ms more, and says when it ran (``log``)."""

    log: list[str] = []

    def step(self, closure=None):
        time.sleep(0.006)
        _SleepingSGD.log.append(f"step {self.param_groups[0]['params'][0].shape[0]}")
        return super().step(closure)


@pytest.mark.filterwarnings("ignore:Full backward hook")  # the first layer's input takes no gradient
def test_update_is_each_layers_step_after_the_backward_pass_as_a_training_step_takes_it(monkeypatch):
    """The profile's update is timed inside step_order_times: every layer's forward, every backward in
    reverse, then each layer's optimiser step in the model's order; a layer with no weights takes
    none, and the weights come out as they went in."""
    monkeypatch.setitem(timing.OPTIMIZERS, "sgd", _SleepingSGD)
    _SleepingSGD.log = []
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    for i, layer in enumerate(module):
        layer.register_forward_pre_hook(lambda m, a, i=i: _SleepingSGD.log.append(f"forward {i}"))
        layer.register_full_backward_pre_hook(lambda m, g, i=i: _SleepingSGD.log.append(f"backward {i}"))
    before = [p.detach().clone() for p in module.parameters()]
    model = models.Model("tiny", module, (torch.randn(8, 4),))
    calls, _ = measure.traced(model)
    _SleepingSGD.log = []
    updates: list[list[float]] = [[] for _ in calls]
    timing.step_order_times(calls, "cpu", 3, warmup=1, updates=updates, optimizer="sgd")
    assert [len(u) for u in updates] == [3, 3, 3]
    assert all(0.006 <= t < 0.05 for i in (0, 2) for t in updates[i]) and updates[1] == [0.0] * 3
    one_pass = ["forward 0", "forward 1", "forward 2", "backward 2", "backward 1", "backward 0", "step 3", "step 2"]
    assert _SleepingSGD.log == one_pass * 4
    assert all(torch.equal(p, b) for p, b in zip(module.parameters(), before))


@pytest.mark.filterwarnings("ignore:Full backward hook")
def test_the_profile_charges_the_step_order_update(monkeypatch):
    monkeypatch.setitem(timing.OPTIMIZERS, "sgd", _SleepingSGD)
    monkeypatch.setattr(measure, "MAX_RUNS", 8)  # a pass of these tiny layers would otherwise repeat 200 times
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    module[0].register_full_backward_pre_hook(lambda m, g: _SleepingSGD.log.append("backward 0"))
    _SleepingSGD.log = []
    profiled = measure.measure(models.Model("tiny", module, (torch.randn(8, 4),)), "cpu", repetitions=4, link_gbps=10)
    updates = [layer.update for layer in profiled.layers]
    assert 0.006 <= updates[0] < 0.05 and updates[1] == 0.0 and 0.006 <= updates[2] < 0.05
    log = _SleepingSGD.log
    after = [log[i + 1 : i + 3] == ["step 3", "step 2"] for i, entry in enumerate(log) if entry == "backward 0"]
    assert sum(after) >= profiled.repetitions  # the timed passes each stepped after their backward
    assert ["step 3", "step 3"] not in [log[i : i + 2] for i in range(len(log))]  # and no step alone in a loop
