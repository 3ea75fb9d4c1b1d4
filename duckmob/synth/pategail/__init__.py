"""PateGail (Wang et al., "PateGail: a privacy-preserving mobility trajectory generator with imitation learning",
AAAI 2024) with an end-to-end (eps, delta) guarantee.

A global policy chooses one of the four EPR actions (stay, home, preferential return, explore) each time slot
(``mdp.py``: the appendix's MDP on a public grid); it is trained with PPO (``policy.py``) on rewards that come
only from per-device ("personal") discriminators (``discriminators.py``: one batched ensemble, each device's
discriminator trained on its own real state-action pairs against generated ones), averaged over devices,
perturbed (eq. 2) and corrected by their variance (eq. 3) (``aggregate.py``).

**Devices.** With ``privacy_unit := 'user'`` each user is one device (holding at most k =
``max_trajectories_per_user`` trajectories, bounded by the release core first); with ``'trajectory'`` each
trajectory is a device. (k = ``unit.max_trajectories_per_user`` of the plan: k > 1 groups by user id; k = 1
treats every trajectory as its own device, which under the user unit with k = 1 is the same thing.)

**What fit releases** (one ledger event, composed by the PLD accountant):

==============  ==============================================================  ===========  ===========================
part            what                                                            sensitivity  mechanism
==============  ==============================================================  ===========  ===========================
count           devices (k = 1) or (trajectories, devices) (k > 1)              1 / (k, 1)   Laplace, count_share eps
                                                                                             (halves for k > 1)
start           start model: histograms of the first cell, the first slot of    1 (L1)       Laplace on every bin,
                the day and the number of slots; each device's mass 1                        start_share eps
                spread over its episodes (counting.normalised_release)
rounds          per round: B reward sums over devices, and the B sums of        sqrt(B) (L2) Gaussian, sigma_round
                squares for eq. 3's variance (aggregate.py)                     per part     calibrated; T rounds
==============  ==============================================================  ===========  ===========================

sigma_round is calibrated (``accounting.calibrate_gaussian_rounds``) so that the composition of the count, the
start model and ``rounds`` Gaussian rounds is (eps, delta)-DP by the PLD accountant. It depends on public
parameters only, so the plan's event (:class:`PateGailPlan`) is exactly what ``fit`` spends. Everything else is
post-processing: the policy sees generated data and noised rewards only (with ``student := true`` it is
rewarded by a student network regressed on every round's released sums, PATE's student, ``student.py``: more
post-processing, nothing more spent); the start (home = first cell, first slot,
length) of every synthetic episode is drawn from the released histograms, never copied from a real user; the
discriminators (the "teachers") are never released. With ``gravity > 0`` exploration also weighs each candidate
cell by its released start share (``attraction``: post-processing of the start model); with ``step_m > 0``
``sample`` draws each slot's move as a line of fixes (``render.py``: post-processing of the model).

The published system (tsinghua-fib-lab/PateGail) noises each reward query but composes nothing, copies each
generated episode's start position and home from a real trajectory, and hard-codes CUDA; none of that here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from duckmob.errors import DuckmobError
from duckmob.privacy import accounting
from duckmob.privacy.counting import count_record, noisy_count, normalised_release
from duckmob.privacy.noise import check_scale
from duckmob.privacy.normcut import normcut
from duckmob.privacy.unit import PrivacyUnit
from duckmob.source.batches import as_batches
from duckmob.synth.base import Plan, ReleaseContext, Synthesizer
from duckmob.synth.compute import cpu_threads, device as torch_device
from duckmob.synth.config import Config, param
from duckmob.synth.neural import NeuralModel, upgrade_info_format_1
from duckmob.synth.dpsgd import torch_generator
from duckmob.synth.pategail import aggregate, mdp
from duckmob.synth.pategail.discriminators import Ensemble, sample_own
from duckmob.synth.pategail.policy import ActorCritic, ppo_update, rollout
from duckmob.synth.pategail.render import render as render_episodes
from duckmob.synth.pategail.student import StudentTrainer
from duckmob.trajectories import Trajectories


@dataclass(frozen=True)
class PateGailConfig(Config):
    """PateGail's public hyper-parameters (``params := {...}`` in SQL), typed and validated."""

    method: ClassVar[str] = "pategail"

    w: int = param(16, int, low=2, high=128, doc="grid width (w x w cells over the bbox)")
    n_slots: int = param(48, int, low=1, high=1440, doc="time slots per day (the paper's GeoLife: 48 half hours)")
    max_steps: int = param(48, int, low=1, high=1440, doc="public cap on slots per episode (later fixes ignored)")
    alpha: float = param(0.6, float, low=0, doc="exploration rank exponent: P(k-th nearest) ~ k^-alpha")
    max_rank: int = param(64, int, low=1, doc="exploration considers the max_rank nearest cells")
    gravity: float = param(0.0, float, low=0, high=4, doc="exploration weighs the k-th nearest cell by k^-alpha "
                                                          "times its released start share to this power")
    rounds: int = param(60, int, low=1, high=100_000, doc="training rounds (each one Gaussian release)")
    episodes: int = param(256, int, low=1, high=1_000_000, doc="generated episodes per round")
    disc_steps: int = param(4, int, low=1, high=1000, doc="discriminator Adam steps per round")
    disc_hidden: int = param(16, int, low=1, high=1024, doc="hidden units of each personal discriminator")
    disc_lr: float = param(5e-3, float, low=0, low_open=True, doc="discriminators' Adam learning rate")
    real_batch: int = param(16, int, low=1, doc="own pairs per device per discriminator step")
    fake_batch: int = param(64, int, low=1, doc="generated pairs per discriminator step")
    hidden: int = param(64, int, low=1, high=4096, doc="policy and value MLP width")
    lr: float = param(3e-3, float, low=0, low_open=True, doc="policy Adam learning rate")
    ppo_epochs: int = param(2, int, low=1, high=100, doc="PPO epochs per round")
    minibatch: int = param(512, int, low=1, doc="PPO minibatch (steps)")
    clip: float = param(0.2, float, low=0, low_open=True, doc="PPO ratio clip")
    entropy: float = param(0.01, float, low=0, doc="entropy bonus")
    gamma: float = param(0.9, float, low=0, high=1, doc="discount factor")
    lam: float = param(0.95, float, low=0, high=1, doc="GAE lambda")
    variance_weight: float = param(0.5, float, low=0, doc="beta of eq. 3: reward = mean - beta * sd (0: eq. 2)")
    student: bool = param(False, bool, doc="reward the policy with a student network regressed on every released "
                                           "noised aggregate so far (PATE's student, student.py; false: the noised "
                                           "rewards themselves, as the paper)")
    student_hidden: int = param(32, int, low=1, high=4096, doc="student MLP width")
    student_steps: int = param(64, int, low=1, high=100_000, doc="student Adam steps per round")
    student_lr: float = param(3e-3, float, low=0, low_open=True, doc="student Adam learning rate")
    student_batch: int = param(1024, int, low=1, doc="student minibatch (labelled pairs)")
    variance_share: float = param(0.2, float, low=0, high=1, high_open=True,
                                  doc="share of each round's Gaussian budget (1/sigma^2) spent on the variance")
    start_share: float = param(0.2, float, low=0, high=0.9, low_open=True, doc="share of eps for the start model")
    count_share: float = param(0.02, float, low=0, high=0.5, low_open=True, doc="share of eps for the counts")
    step_m: float = param(0.0, float, low=0, doc="sample: draw each slot's move as a line of fixes about step_m "
                                                 "metres apart (public; 0: one point per slot, the paper's output)")
    slot_points: int = param(64, int, low=1, high=1440, doc="sample with step_m > 0: at most this many fixes per "
                                                            "slot (public cap)")
    base_date: str = param("2008-01-01", str, date=True, doc="public date of the synthetic times")
    device: str | None = param(None, str, doc="torch device of the discriminators; null: CUDA when available")
    threads: int = param(1, int, low=1, high=1024,
                         doc="torch CPU threads during fit and sample (the tensors are small: one is fastest)")

    def check(self) -> None:
        torch_device(self.device, self.label())    # a device torch cannot name is refused with the parameters
        if self.start_share + self.count_share >= 0.95:
            raise DuckmobError("PateGail parameters start_share + count_share must leave eps for the rounds "
                               "(their sum must be below 0.95)")
        if self.variance_weight > 0 and self.variance_share == 0:
            raise DuckmobError("PateGail parameter variance_weight > 0 needs variance_share > 0 (the variance is "
                               "released privately); set variance_weight := 0 for eq. 2 alone")


def sample_env(start: dict, config: PateGailConfig, ranks: np.ndarray, n: int, rng: np.random.Generator) -> mdp.Env:
    """``n`` agents whose home (first cell), first slot and length are drawn from the start model."""
    cell = rng.choice(len(start["p_cell"]), size=n, p=start["p_cell"])
    slot = rng.choice(len(start["p_slot"]), size=n, p=start["p_slot"])
    steps = rng.choice(len(start["p_steps"]), size=n, p=start["p_steps"]) + 1
    return mdp.Env(cell, slot, steps, w=config.w, n_slots=config.n_slots, max_steps=config.max_steps,
                   alpha=config.alpha, ranks=ranks, rng=rng, attraction=attraction(start["p_cell"], config.gravity))


def attraction(p_cell: np.ndarray, gravity: float) -> np.ndarray | None:
    """Each cell's weight as an exploration target: its released start share to the power ``gravity`` (a gravity
    model's mass; TimeGeo's exploration weighs rank alone, gravity 0), floored at a tenth of the uniform share so
    that no cell is unreachable. Post-processing of the start model."""
    if gravity == 0:
        return None
    return np.maximum(np.asarray(p_cell, dtype=np.float64), 0.1 / len(p_cell)) ** float(gravity)


def max_points(config: PateGailConfig) -> int:
    """``max_steps + 1`` (one point at the start of the first slot and one at the end of every step), or with
    ``step_m > 0`` ``max_steps * slot_points + 1`` (up to ``slot_points`` fixes per slot)."""
    per_slot = int(config.slot_points) if config.step_m > 0 else 1
    return int(config.max_steps) * per_slot + 1


def upgrade_format_1(stored: dict) -> dict:
    """A format-1 payload (duckmob before models carried a version: the same torch dict) in format 2's words:
    the contribution bound in ``info`` is named ``max_trajectories_per_user`` (format 1: ``contribution_bound``)."""
    return {**stored, "info": upgrade_info_format_1(stored["info"])}


class PateGailModel(NeuralModel):
    """A fitted PateGail: public configuration, the DP start model and policy weights, the spent event.

    Payload (format 2): ``torch.save`` of a dict ``bbox`` (list), ``config`` (the config's fields but the machine's
    settings, :meth:`~duckmob.synth.config.Config.stored_dict`; models stored before kept them, ignored), ``start``
    (the three start histograms as tensors), ``state`` (the policy's weights), ``event_json`` and ``info``."""

    method = "pategail"
    format_version = 2

    def __init__(self, bbox: list, config: PateGailConfig, start: dict, state: dict, event_json: str, info: dict):
        self.bbox, self.config = bbox, config
        self.start = {n: np.asarray(v, dtype=np.float64) for n, v in start.items()}
        self.state, self.event_json, self.info = state, event_json, dict(info)
        self.timings: dict = {}
        self._policy = None

    def policy(self) -> ActorCritic:
        if self._policy is None:
            with torch.random.fork_rng(devices=[]):
                net = ActorCritic(self.config.hidden)
            net.load_state_dict(self.state)
            self._policy = net
        return self._policy

    def sample_episodes(self, n: int, rng: np.random.Generator) -> mdp.Episodes:
        """``n`` generated episodes (post-processing; the policy runs on the CPU)."""
        config = self.config
        ranks = mdp.nearest_ranks(config.w, config.max_rank)
        env = sample_env(self.start, config, ranks, int(n), rng)
        with cpu_threads(config.threads):
            rollout(self.policy(), env, torch_generator(rng, torch.device("cpu")))
        return env.episodes()

    @property
    def max_points(self) -> int:
        """The public cap on points per trajectory: :func:`max_points` of the config."""
        return max_points(self.config)

    def sample(self, n: int, rng: np.random.Generator) -> Trajectories:
        """``n`` trajectories: one point per (episode, cell) uniformly inside the cell (an episode that comes
        back to a cell comes back to its point), at the start of the first slot and the end of every slot; with
        ``step_m > 0`` each slot's move drawn as a line of fixes about ``step_m`` metres apart (``render.py``)."""
        config = self.config
        ep = self.sample_episodes(int(n), rng)
        base = int(np.datetime64(config.base_date, "us").astype(np.int64))
        return render_episodes(ep, self.bbox, config.w, config.n_slots, base, rng, config.step_m, config.slot_points)

    def stored(self) -> dict[str, Any]:
        return dict(bbox=self.bbox, config=self.config.stored_dict(),
                    start={n: torch.from_numpy(v) for n, v in self.start.items()},
                    state=self.state, event_json=self.event_json, info=self.info)

    @classmethod
    def restore(cls, stored: dict[str, Any], version: int, method: str) -> "PateGailModel":
        if version == 1:
            stored = upgrade_format_1(stored)
        return cls(stored["bbox"], PateGailConfig.restored(stored["config"]),
                   {n: v.numpy() for n, v in stored["start"].items()}, stored["state"], stored["event_json"],
                   stored["info"])

    def describe(self) -> dict[str, Any]:
        return {**self.config.stored_dict(), **self.info}


def device_count_epsilons(eps_count: float, max_trajectories_per_user: int) -> tuple[float, ...]:
    """PateGail's own split of the count budget (not :func:`duckmob.privacy.counting.count_shares`): the device
    count alone when devices are trajectories (k = 1), else the trajectory count (sensitivity k) and the device
    count (sensitivity 1), half of ``eps_count`` each. The device count scales the rewards; the trajectory count
    is only the default n of sample."""
    if max_trajectories_per_user == 1:
        return (eps_count,)
    return tuple(accounting.split(eps_count, {"trajectories": 0.5, "devices": 0.5}).values())


def rounds_ran(event, sigma_round: float, rounds: int):
    """``event`` (a fit's: Laplace parts and one ``gaussian_rounds``) as far as it ran when ``rounds`` reward rounds
    had begun: its Laplace parts and ``gaussian_rounds(sigma_round, rounds)`` (left out at 0 rounds), whose
    multiplier ``sigma_round / sqrt(rounds)`` is at least the planned one, so within ``event``."""
    parts = [leaf for leaf in event.leaves() if leaf.kind != "gaussian"]
    return accounting.compose(parts + ([accounting.gaussian_rounds(sigma_round, rounds)] if rounds else []))


@dataclass(frozen=True, kw_only=True)
class PateGailPlan(Plan):
    """PateGail's schedule at (eps, delta) for a unit, from public parameters only: the start model's epsilon,
    the counts' epsilons (:func:`device_count_epsilons`) and the Gaussian multiplier of each of the ``rounds``
    reward rounds, calibrated so that ``event`` (their composition) spends (eps, delta)."""

    eps_start: float
    count_eps: tuple[float, ...]
    sigma_round: float
    rounds: int


class PateGail(Synthesizer):
    """PateGail with public hyper-parameters (:class:`PateGailConfig`); ``fit`` is one (eps, delta) release."""

    method = "pategail"
    config_class = PateGailConfig
    model_class = PateGailModel
    default_delta = 1e-5
    needs_delta = True
    mechanism = "releases Gaussian rounds"
    needs_time = True
    config: PateGailConfig

    # -- accounting ---------------------------------------------------------------------------------------
    def plan(self, eps: float, delta: float, unit: PrivacyUnit = PrivacyUnit(), prior=None) -> PateGailPlan:
        """The run's privacy parameters from public parameters only (see the module docstring): the counts and the
        start model (Laplace) and ``rounds`` Gaussian rounds, composed; exactly what fit spends."""
        config = self.config
        k = unit.max_trajectories_per_user
        parts = accounting.split(eps, {"start": config.start_share, "count": config.count_share})
        eps_start = parts["start"]
        check_scale(1.0 / eps_start)
        count_eps = device_count_epsilons(parts["count"], k)
        for eps_part, sensitivity in zip(count_eps, (k, 1)):
            check_scale(sensitivity / eps_part)
        fixed = [accounting.laplace(eps_start)] + [accounting.laplace(e) for e in count_eps]
        sigma = accounting.calibrate_gaussian_rounds(fixed, config.rounds, eps, delta)
        event = accounting.compose(fixed + [accounting.gaussian_rounds(sigma, config.rounds)])
        return PateGailPlan(eps=eps, delta=delta, unit=unit, event=event, bbox=self.bbox, needs_time=self.needs_time,
                            max_points=max_points(config), eps_start=eps_start, count_eps=count_eps,
                            sigma_round=sigma, rounds=config.rounds)

    # -- data ------------------------------------------------------------------------------------------------
    def devices(self, data: Trajectories, max_trajectories_per_user: int) -> np.ndarray:
        """Device index 0..n-1 of each trajectory: its user (k > 1) or itself (k = 1)."""
        if max_trajectories_per_user > 1:
            return np.unique(np.asarray(data.user_id), return_inverse=True)[1].astype(np.int64).reshape(-1)
        return np.arange(data.n_trajectories, dtype=np.int64)

    def start_model(self, ep: mdp.Episodes, n_devices: int, eps_start: float, noise) -> dict[str, np.ndarray]:
        """DP histograms of the first cell, the first slot and the number of slots: one normalised release
        (each device's mass 1 split over its episodes' three windows; L1 sensitivity 1; Laplace(1 / eps_start) on
        every bin), NormCut, normalised (uniform where nothing is left)."""
        config = self.config
        c = config.w * config.w
        sizes = (c, config.n_slots, config.max_steps)
        index = np.stack([ep.cells[:, 0], c + ep.first_slot, c + config.n_slots + ep.steps - 1],
                         axis=1).reshape(-1)
        owner = np.repeat(ep.device, 3)
        n_windows = 3 * np.bincount(ep.device, minlength=n_devices)
        noisy = normalised_release(index, owner, n_windows, sum(sizes), 1.0 / eps_start, noise)
        out = {}
        for name, part in zip(("p_cell", "p_slot", "p_steps"), np.split(noisy, np.cumsum(sizes)[:-1])):
            p = normcut(part[None, :])[0]
            out[name] = p / p.sum() if p.sum() > 0 else np.full(len(p), 1.0 / len(p))
        return out

    # -- fit -------------------------------------------------------------------------------------------------
    def fit(self, source, plan: PateGailPlan, release: ReleaseContext) -> PateGailModel:
        """One (eps, delta)-DP release of ``plan`` for one device (see the module docstring for the privacy map)."""
        with cpu_threads(self.config.threads):
            return self._fit(source, plan, release)

    def _fit(self, source, plan: PateGailPlan, release: ReleaseContext) -> PateGailModel:
        config = self.config
        k = plan.unit.max_trajectories_per_user
        noise = release.noise
        # out of core: the first fix and the last fix of each slot of every trajectory, in the in-memory order
        data = as_batches(source).gather(lambda d: mdp.episode_fixes(d, config.n_slots, config.max_steps))
        t0 = time.perf_counter()
        # separate streams: the policy's and the environment's draws never depend on how many devices there are
        rng, noise_rng, device_rng = noise.generator(), noise.generator(), noise.generator()
        gen = torch_generator(rng, torch.device("cpu"))
        device = torch_device(config.device, PateGailConfig.label())
        ep, x_real, dev_offsets = self._device_episodes(data, k)
        n_dev = len(dev_offsets) - 1
        # (1) counts and (2) the start model
        n_dev_noisy, n_traj_noisy = _noisy_counts(ep.n, n_dev, k, plan.count_eps, noise)
        start = self.start_model(ep, n_dev, plan.eps_start, noise)

        # (3) rounds: discriminators on the devices, PPO on the noised rewards
        ranks = mdp.nearest_ranks(config.w, config.max_rank)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(rng.integers(2 ** 62)))
            policy = ActorCritic(config.hidden)
        opt = torch.optim.Adam(policy.parameters(), lr=config.lr)
        ens = Ensemble(n_dev, mdp.N_FEATURES, config.disc_hidden, config.disc_lr,
                       torch_generator(device_rng, torch.device("cpu")), device) if n_dev else None
        x_real_t = torch.from_numpy(x_real).to(device)
        with_var = config.variance_weight > 0
        sigma = plan.sigma_round
        # the student (post-processing of the released sums): its own torch stream, drawn only when it is used
        student = StudentTrainer(mdp.N_FEATURES, config.student_hidden, 2 if with_var else 1, config.student_lr,
                                 config.student_steps, config.student_batch,
                                 torch_generator(noise.generator(), torch.device("cpu"))) if config.student else None
        # a failure or Ctrl-C is charged the rounds that began (docs/threat_model.md, "A stopped fit is charged
        # what ran"): the Laplace parts, drawn above, and gaussian_rounds(sigma, rounds run)
        rounds_run = 0
        try:
            for _ in range(plan.rounds):
                release.check_interrupt()
                rounds_run += 1
                env = sample_env(start, config, ranks, config.episodes, rng)
                ro = rollout(policy, env, gen)
                x_fake, rows, cols = mdp.episode_pairs(env.episodes(), config.w, config.n_slots, config.max_steps)
                outputs = _discriminate(ens, x_real_t, x_fake, dev_offsets, config, rng, device_rng, device)
                s1, s2 = aggregate.device_sums(outputs, with_var)
                x1, x2 = aggregate.release_round(s1, s2, sigma, config.variance_share if with_var else 0.0, noise_rng)
                r = np.zeros(ro.live.shape)
                r[rows, cols] = _rewards(x1, x2, x_fake, n_dev_noisy, student, config.variance_weight)
                ppo_update(policy, opt, ro, r, gamma=config.gamma, lam=config.lam, clip=config.clip,
                           epochs=config.ppo_epochs, minibatch=config.minibatch, entropy=config.entropy, gen=gen)
        except BaseException:
            release.stopped(rounds_ran(plan.event, sigma, rounds_run))
            raise
        info = dict(eps=plan.eps, delta=plan.delta, epsilon_accounted=accounting.epsilon(plan.event, plan.delta),
                    n_devices_noisy=round(float(n_dev_noisy), 1), n_noisy=round(float(n_traj_noisy), 1),
                    sigma_round=sigma, eps_start=plan.eps_start, eps_counts=list(plan.count_eps),
                    max_trajectories_per_user=k, seeded=bool(noise.seeded), **count_record(plan.count_eps[0], k))
        model = PateGailModel(self.bbox.as_list(), config, start,
                              {n: v.detach().cpu() for n, v in policy.state_dict().items()}, plan.event.to_json(), info)
        model.timings = {"fit_s": time.perf_counter() - t0}
        return model

    def _device_episodes(self, data: Trajectories, k: int) -> tuple[mdp.Episodes, np.ndarray, np.ndarray]:
        """The real episodes sorted by device (numbered 0..n-1 over the devices that hold one), their (state,
        action) pairs ``x_real`` and the offsets of each device's pairs in them (n + 1 of them); every episode has
        >= 1 step, so every device holds >= 1 pair."""
        config = self.config
        ep = mdp.episodes(data, self.bbox, config.w, config.n_slots, config.max_steps, self.devices(data, k))
        used, dense = np.unique(ep.device, return_inverse=True)
        order = np.argsort(dense, kind="stable")
        ep = mdp.Episodes(ep.cells[order], ep.steps[order], ep.first_slot[order], dense.reshape(-1)[order])
        n_dev = len(used)
        x_real, ep_of_pair, _ = mdp.episode_pairs(ep, config.w, config.n_slots, config.max_steps)
        dev_offsets = np.concatenate([[0], np.cumsum(np.bincount(ep.device[ep_of_pair], minlength=n_dev))])
        return ep, x_real, dev_offsets


def _noisy_counts(n_traj: int, n_dev: int, k: int, count_eps, noise) -> tuple[float, float]:
    """Part (1) of the spend, (noisy devices, noisy trajectories): with k = 1 one count (a device is a trajectory;
    sensitivity 1); else the trajectories at sensitivity k and the devices (users) at sensitivity 1."""
    if k == 1:
        n_dev_noisy = noisy_count(n_dev, count_eps[0], noise)
        return n_dev_noisy, n_dev_noisy
    n_traj_noisy = noisy_count(n_traj, count_eps[0], noise, sensitivity=k)
    return noisy_count(n_dev, count_eps[1], noise), n_traj_noisy


def _discriminate(ens, x_real_t, x_fake, dev_offsets, config: PateGailConfig, rng, device_rng, device):
    """One round's discriminator outputs on the fake pairs ``x_fake``, one row per device, after each device's
    discriminator trained ``disc_steps`` steps on its own real pairs against fake ones (no device: no rows)."""
    if ens is None:
        return torch.zeros((0, len(x_fake)))
    x_fake_t = torch.from_numpy(x_fake).to(device)
    for _step in range(config.disc_steps):
        own = sample_own(dev_offsets, config.real_batch, device_rng)
        real = x_real_t[torch.from_numpy(own).to(device)]
        pick = torch.from_numpy(rng.integers(0, len(x_fake), config.fake_batch)).to(device)
        ens.train_step(real, x_fake_t[pick])
    return ens.outputs(x_fake_t)


def _rewards(x1, x2, x_fake, n_dev_noisy, student, variance_weight: float) -> np.ndarray:
    """The rewards of the fake pairs from one round's released sums (post-processing): directly, or through the
    student trained on every round's released moments so far."""
    if student is None:
        return aggregate.rewards(x1, x2, n_dev_noisy, variance_weight)
    student.add(x_fake, aggregate.moments(x1, x2, n_dev_noisy))
    student.fit()
    return aggregate.moment_rewards(student.predict(x_fake), variance_weight)


__all__ = ["PateGail", "PateGailConfig", "PateGailModel", "PateGailPlan"]
