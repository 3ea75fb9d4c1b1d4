"""HRNet's training loops stop where ``check_interrupt`` raises, and what it raises comes out unchanged."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch
import tqdm
from torch.optim.optimizer import register_optimizer_step_post_hook

from duckmob.errors import DuckmobError
from duckmob.privacy.unit import PrivacyUnit
from duckmob.synth import dpsgd
from duckmob.synth.hrnet import HRNet, train as tr
from duckmob.synth.hrnet.pretrain import pretrain as run_pretrain
from duckmob.synth.hrnet.model import BaselineModel, HRNetModel


class Stop(Exception):
    pass


def raising_on(n: int, exc: type[BaseException] = Stop):
    """A check_interrupt that counts its calls and raises ``exc`` on call ``n``."""
    calls = []

    def check() -> None:
        calls.append(None)
        if len(calls) == n:
            raise exc("stop here")

    check.calls = calls
    return check


@pytest.fixture
def optimizer_steps():
    """How many optimizer steps ran (any optimizer: opacus's DPOptimizer steps the Adam it wraps)."""
    steps = []
    handle = register_optimizer_step_post_hook(lambda opt, args, kwargs: steps.append(None))
    yield steps
    handle.remove()


@pytest.fixture
def bars(monkeypatch):
    """Every tqdm bar the loops open, with whether it was closed."""
    made = []

    class Recording(tqdm.tqdm):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.was_closed = False
            made.append(self)

        def close(self):
            self.was_closed = True
            super().close()

    monkeypatch.setattr(tqdm, "tqdm", Recording)
    return made


def train(check, steps=10):
    g = torch.Generator().manual_seed(0)
    cells = torch.randint(0, 16, (6, 4), generator=g)
    times = torch.randint(0, 5, (6, 4), generator=g)
    lengths = torch.randint(1, 4, (6,), generator=g)
    data = tr.TrainingData(cells.numpy(), times.numpy(), lengths.numpy(), np.arange(6))
    model = BaselineModel(2, loc_dim=4, time_dim=2, hidden=4)
    schedule = tr.Schedule(sample_rate=0.5, steps=steps, noise_multiplier=1.0, max_grad_norm=1.0,
                           expected_batch_size=3, lr=0.1)
    return tr.dp_sgd_train(model, data, schedule, tr.RunContext(np.random.default_rng(0), torch.device("cpu"),
                                                               progress=False, check_interrupt=check))


def pretrain(check, iterations=10):
    model = HRNetModel(2, n_time=3, loc_dim=4, time_dim=2, hidden=4, key_dim=4)
    noisy = np.random.default_rng(0).poisson(3.0, (16, 16)).astype(float)
    run_pretrain(model, noisy, iterations=iterations, batch=4, lr=0.01, rng=np.random.default_rng(0),
                 device=torch.device("cpu"), progress=False, check_interrupt=check)


def test_dp_sgd_stops_at_the_step_whose_check_raises(optimizer_steps, bars):
    check = raising_on(3)
    with pytest.raises(Stop, match="stop here"):
        train(check)
    # called before each step: steps 1 and 2 ran, the third call stopped the third step before it started
    assert len(check.calls) == 3 and len(optimizer_steps) == 2
    assert len(bars) == 1 and bars[0].was_closed


def test_dp_sgd_calls_check_once_per_step(optimizer_steps):
    check = raising_on(0)  # never raises
    assert train(check, steps=7).steps == 7
    assert len(check.calls) == 7 and len(optimizer_steps) == 7


def test_pretrain_stops_at_the_iteration_whose_check_raises(optimizer_steps, bars):
    check = raising_on(3)
    with pytest.raises(Stop, match="stop here"):
        pretrain(check)
    assert len(check.calls) == 3 and len(optimizer_steps) == 2
    assert len(bars) == 1 and bars[0].was_closed
    check = raising_on(0)
    pretrain(check, iterations=5)
    assert len(check.calls) == 5


@pytest.mark.parametrize("loop", [train, pretrain])
def test_keyboard_interrupt_from_the_check_propagates(loop, bars):
    with pytest.raises(KeyboardInterrupt):
        loop(raising_on(2, KeyboardInterrupt))
    assert bars and all(bar.was_closed for bar in bars)


def test_without_a_check_training_runs_all_steps(optimizer_steps):
    assert train(None, steps=3).steps == 3
    pretrain(None, iterations=2)
    assert len(optimizer_steps) == 5


def test_without_a_terminal_a_fit_says_it_is_alive_in_ten_lines(capsys):
    """Off a terminal (a log, CI, a notebook's stream) the DP-SGD loop writes one line per tenth of its steps,
    step counts only; with progress=False nothing."""
    from duckmob.progress import Steps

    lines = Steps("HRNet DP-SGD", 37)
    for _ in range(37):
        lines.update(1)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 10 and err[0] == "duckmob: HRNet DP-SGD: 10% (4/37 steps)"
    assert err[-1] == "duckmob: HRNet DP-SGD: 100% (37/37 steps)"


def test_the_dp_sgd_run_takes_its_schedule_and_its_context_and_few_parameters():
    """The planned DP-SGD run's schedule spends the plan's dp_sgd leaf; a sampling rate outside (0, 1] is refused
    where the schedule is made; no function on the way from the plan to the loop takes more than 8 parameters."""
    synth = HRNet([0.0, 0.0, 1.0, 1.0], w=8, epochs=2, pretrain_iterations=5)
    plan = synth.plan(2.0, 1e-5, PrivacyUnit.user(3))
    schedule = plan.dp_sgd(synth.config)
    (leaf,) = [e for e in plan.event.leaves() if e.kind == "dp_sgd"]
    assert schedule.event == leaf and schedule.expected_batch_size == plan.expected_batch
    assert (schedule.lr, schedule.lr_final, schedule.ema) == (synth.config.lr, synth.config.lr_final, 0.0)
    for rate in (0.0, 1.5):
        with pytest.raises(DuckmobError, match=r"sampling rate must be in \(0, 1\]"):
            dpsgd.Schedule(sample_rate=rate, steps=1, noise_multiplier=1.0, max_grad_norm=1.0,
                           expected_batch_size=1.0, lr=0.1)
    for fn in (tr.dp_sgd_train, dpsgd.train, dpsgd.train_ghost, dpsgd._loop):
        assert len(inspect.signature(fn).parameters) <= 8, fn.__name__
