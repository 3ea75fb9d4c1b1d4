"""PateGail's global policy (Wang et al., AAAI 2024, "Policy Function"), trained with PPO (Schulman et al. 2017)
on the noised rewards only.

The paper's policy is a self-attention transformer over the visit history; ours reads the same history through
the fixed state features of ``mdp.state_features`` with a small MLP (the information the private rewards carry
cannot train more: at 180 devices they are mostly noise, see docs/sql.md). Actor and critic are separate MLPs.
The actor's last layer starts at zero: the initial policy is uniform over the four EPR actions (public).

Everything here is post-processing of the noised rewards (and public generated data).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from duckmob.synth.pategail.mdp import N_ACTIONS, N_STATE_FEATURES, Env


class ActorCritic(nn.Module):
    """Action logits and state value from the state features."""

    def __init__(self, hidden: int):
        super().__init__()
        self.actor = nn.Sequential(nn.Linear(N_STATE_FEATURES, hidden), nn.Tanh(), nn.Linear(hidden, hidden),
                                   nn.Tanh(), nn.Linear(hidden, N_ACTIONS))
        self.critic = nn.Sequential(nn.Linear(N_STATE_FEATURES, hidden), nn.Tanh(), nn.Linear(hidden, 1))
        nn.init.zeros_(self.actor[-1].weight)
        nn.init.zeros_(self.actor[-1].bias)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.actor(x), self.critic(x).squeeze(-1)


@dataclass
class Rollout:
    """One batch of generated episodes: env (its episodes), per step (n, T): features, chosen actions, their
    log-probabilities, values, and the mask of live steps."""

    env: Env
    features: np.ndarray
    actions: np.ndarray
    logp: np.ndarray
    values: np.ndarray
    live: np.ndarray


@torch.no_grad()
def rollout(policy: ActorCritic, env: Env, gen: torch.Generator, temperature: float = 1.0) -> Rollout:
    """Run every agent of ``env`` to the end of its episode; actions sampled from the policy with ``gen``."""
    t_max = int(env.steps.max()) if env.n else 0
    n = env.n
    feats = np.zeros((n, t_max, N_STATE_FEATURES), dtype=np.float32)
    actions = np.zeros((n, t_max), dtype=np.int64)
    logp = np.zeros((n, t_max), dtype=np.float32)
    values = np.zeros((n, t_max), dtype=np.float32)
    for t in range(t_max):
        x = env.features()
        logits, v = policy(torch.from_numpy(x))
        dist = torch.distributions.Categorical(logits=logits / temperature)
        a = torch.multinomial(dist.probs, 1, generator=gen).squeeze(1)
        feats[:, t], actions[:, t] = x, a.numpy()
        logp[:, t], values[:, t] = dist.log_prob(a).numpy(), v.numpy()
        env.step(actions[:, t])
    live = np.arange(t_max)[None, :] < env.steps[:, None]
    return Rollout(env, feats, actions, logp, values, live)


def advantages(rewards: np.ndarray, values: np.ndarray, live: np.ndarray, gamma: float,
               lam: float) -> tuple[np.ndarray, np.ndarray]:
    """Generalised advantage estimation (Schulman et al. 2016) over padded episodes: (advantages, returns)."""
    n, t_max = rewards.shape
    adv = np.zeros((n, t_max), dtype=np.float64)
    last = np.zeros(n)
    for t in range(t_max - 1, -1, -1):
        nxt_v = values[:, t + 1] * live[:, t + 1] if t + 1 < t_max else np.zeros(n)
        delta = rewards[:, t] + gamma * nxt_v - values[:, t]
        last = np.where(live[:, t], delta + gamma * lam * last * (live[:, t + 1] if t + 1 < t_max else 0), 0.0)
        adv[:, t] = last
    return adv, adv + values


def ppo_update(policy: ActorCritic, opt: torch.optim.Optimizer, ro: Rollout, rewards: np.ndarray, *, gamma: float,
               lam: float, clip: float, epochs: int, minibatch: int, entropy: float, gen: torch.Generator) -> None:
    """PPO-clip epochs over the live steps of ``ro`` with per-step ``rewards`` (n, T) (noised, post-processing)."""
    adv, ret = advantages(rewards, ro.values.astype(np.float64), ro.live, gamma, lam)
    rows, cols = np.nonzero(ro.live)
    if len(rows) < 2:
        return
    x = torch.from_numpy(ro.features[rows, cols])
    a = torch.from_numpy(ro.actions[rows, cols])
    old = torch.from_numpy(ro.logp[rows, cols])
    adv_t = torch.from_numpy(adv[rows, cols]).float()
    adv_t = (adv_t - adv_t.mean()) / (adv_t.std() + 1e-8)
    ret_t = torch.from_numpy(ret[rows, cols]).float()
    m = len(rows)
    for _ in range(epochs):
        perm = torch.randperm(m, generator=gen)
        for lo in range(0, m, minibatch):
            idx = perm[lo:lo + minibatch]
            logits, v = policy(x[idx])
            dist = torch.distributions.Categorical(logits=logits)
            ratio = torch.exp(dist.log_prob(a[idx]) - old[idx])
            surrogate = torch.min(ratio * adv_t[idx], torch.clamp(ratio, 1 - clip, 1 + clip) * adv_t[idx])
            loss = -surrogate.mean() + 0.5 * ((v - ret_t[idx]) ** 2).mean() - entropy * dist.entropy().mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
            opt.step()
