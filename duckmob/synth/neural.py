"""What the fitted models of the neural methods share (HRNet and its baseline, clean-slate, PateGail).

Their fitted state is torch tensors (weights trained with DP-SGD or from noised rewards) plus public facts of the
fit in ``info``: the noisy trajectory count ``n_noisy`` sizes a sample when no n is given, and ``event_json`` is
the accounting event the fit spent. They are stored as one ``torch.save`` dict, read back with
``weights_only=True`` (tensors and plain values only, no code); the config goes in without the machine's settings
(:meth:`duckmob.synth.config.Config.stored_dict`) and comes back by :meth:`duckmob.synth.config.Config.restored`.
"""

from __future__ import annotations

import io
from abc import abstractmethod
from typing import Any

import torch

from duckmob.privacy.events import Event
from duckmob.synth.base import Model


def upgrade_info_format_1(info: dict[str, Any]) -> dict[str, Any]:
    """A format-1 model's ``info`` (duckmob before stored models carried a version) in format 2's words: the
    contribution bound is named ``max_trajectories_per_user`` (format 1: ``contribution_bound``)."""
    info = dict(info)
    if "contribution_bound" in info:
        info["max_trajectories_per_user"] = info.pop("contribution_bound")
    return info


class NeuralModel(Model):
    """A :class:`~duckmob.synth.base.Model` whose state is a torch dict: subclasses say what goes in it
    (:meth:`stored`) and how it comes back, upgrading older formats (:meth:`restore`)."""

    info: dict[str, Any]
    event_json: str

    @property
    def default_n(self) -> int:
        """The noisy trajectory count of the training data (what ``sample`` draws when no n is given)."""
        return max(int(round(self.info["n_noisy"])), 0)

    @property
    def event(self) -> Event:
        """The accounting event this fit spent (recorded in the ledger once)."""
        return Event.from_json(self.event_json)

    @abstractmethod
    def stored(self) -> dict[str, Any]:
        """The dict the payload holds (tensors and plain values)."""

    @classmethod
    @abstractmethod
    def restore(cls, stored: dict[str, Any], version: int, method: str) -> "NeuralModel":
        """The model from :meth:`stored`'s dict in layout ``version`` (an older one upgraded explicitly)."""

    def payload(self) -> bytes:
        buf = io.BytesIO()
        torch.save(self.stored(), buf)
        return buf.getvalue()

    @classmethod
    def load(cls, payload: bytes, version: int, method: str) -> "NeuralModel":
        return cls.restore(torch.load(io.BytesIO(bytes(payload)), weights_only=True), version, method)
