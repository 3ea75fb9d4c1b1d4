"""PateGail's student discriminator (PATE-GAN's student, Jordon et al. 2019; Papernot et al. 2017): a small
network on the (state, action) features that regresses the noised aggregate of the teachers' votes.

Each round ``aggregate.release_round`` releases, for every generated (state, action) pair q of the round, the
noised sum over teachers of their votes on q (and of their squares when eq. 3's variance is used). One query's
noise has sd ``sigma_1 sqrt(B)`` over a sum of at most n, so a single reward is mostly noise; the policy used
to read those rewards directly. The student instead fits ``E[vote | features]`` by least squares on every
released (pair, noised mean) of every round so far (a replay buffer): zero-mean Gaussian noise averages out over
the thousands of labelled pairs that share a region of feature space, and the policy is rewarded by the
student's prediction on all of its pairs.

**Privacy.** The student reads generated pairs (public: produced by the policy from earlier releases) and the
released noised sums only: post-processing of the accounted rounds, nothing more is spent. It is never released
(only the policy is stored).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


class Student(nn.Module):
    """``outputs`` predicted moments of the teachers' votes (1: the mean; 2: mean and mean of squares)."""

    def __init__(self, n_features: int, hidden: int, outputs: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(n_features, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
                                 nn.Linear(hidden, outputs))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class StudentTrainer:
    """The student, its Adam optimiser and the buffer of every labelled pair released so far."""

    def __init__(self, n_features: int, hidden: int, outputs: int, lr: float, steps: int, batch: int,
                 gen: torch.Generator):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(torch.randint(0, 2 ** 62, (1,), generator=gen)))
            self.model = Student(n_features, hidden, outputs)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=lr)
        self.steps, self.batch, self.gen = steps, batch, gen
        self.x: list[torch.Tensor] = []
        self.y: list[torch.Tensor] = []

    def add(self, x: np.ndarray, y: np.ndarray) -> None:
        """Label the pairs ``x`` (B, F) with the released noised moments ``y`` (B, outputs)."""
        self.x.append(torch.from_numpy(np.asarray(x, dtype=np.float32)))
        self.y.append(torch.from_numpy(np.asarray(y, dtype=np.float32)))

    def fit(self) -> None:
        """``steps`` Adam steps of mean squared error on minibatches drawn from the whole buffer."""
        x, y = torch.cat(self.x), torch.cat(self.y)
        m = len(x)
        for _ in range(self.steps):
            idx = torch.randint(0, m, (min(self.batch, m),), generator=self.gen)
            loss = ((self.model(x[idx]) - y[idx]) ** 2).mean()
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            self.opt.step()

    @torch.no_grad()
    def predict(self, x: np.ndarray) -> np.ndarray:
        """Predicted moments (B, outputs), float64."""
        return self.model(torch.from_numpy(np.asarray(x, dtype=np.float32))).double().numpy()
