"""Typed, validated hyper-parameters: one frozen dataclass per method, every field declared with :func:`param`.

A method's config is a ``@dataclass(frozen=True)`` whose fields carry their kind and valid range::

    @dataclass(frozen=True)
    class PrivTraceConfig(Config):
        K: int | None = param(None, int, low=1, high=1024, doc="first-layer cells per side")

``PrivTraceConfig.parse(params)`` takes what the user wrote (a dict from JSON or a SQL STRUCT: numbers may come
as floats, ``None`` means "the default") and returns a config or raises one DuckmobError naming the parameter,
what it must be, and what was given. Unknown names are refused with the list of known ones. Hyper-parameters are
public: nothing here reads data.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import numpy as np

from duckmob.errors import DuckmobError


def param(default, kind: type, *, low=None, high=None, low_open: bool = False, high_open: bool = False, choices=None,
          nullable: bool = False, date: bool = False, doc: str = ""):
    """A config field: ``kind`` is int, float, bool, str, dict or list; ``low``/``high`` bound numbers
    (``low_open``/``high_open``: strictly inside); ``choices`` lists allowed strings; ``date`` asks a string to be a
    date numpy can read (``'2008-01-01'``); ``nullable`` admits None (a default of None implies it)."""
    meta = dict(kind=kind, low=low, high=high, low_open=low_open, high_open=high_open, choices=tuple(choices) if choices else None,
                nullable=nullable or default is None, date=date, doc=doc)
    if isinstance(default, (dict, list)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def _describe(meta) -> str:
    kind = meta["kind"]
    if meta["choices"]:
        return "one of " + ", ".join(repr(c) for c in meta["choices"])
    if meta.get("date"):
        return "a date such as '2008-01-01'"
    what = {int: "an integer", float: "a number", bool: "true or false", str: "a string", dict: "an object",
            list: "a list"}[kind]
    low, high = meta["low"], meta["high"]
    if low is not None and high is not None:
        what += f" in {'(' if meta['low_open'] else '['}{low}, {high}{')' if meta['high_open'] else ']'}"
    elif low is not None:
        what += f" {'>' if meta['low_open'] else '>='} {low}"
    elif high is not None:
        what += f" {'<' if meta['high_open'] else '<='} {high}"
    return what + (" or null" if meta["nullable"] else "")


def _coerce(name: str, value, meta, method: str):
    """The value as the field's kind, or DuckmobError."""
    kind = meta["kind"]
    if value is None:
        if meta["nullable"]:
            return None
        raise DuckmobError(f"{method} parameter {name} must be {_describe(meta)}, got null")
    bad = DuckmobError(f"{method} parameter {name} must be {_describe(meta)}, got {value!r}")
    if kind is bool:
        if not isinstance(value, bool):
            raise bad
        return value
    if kind in (int, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad
        if not math.isfinite(value):
            raise bad
        if kind is int:
            if int(value) != value:
                raise bad
            value = int(value)
        else:
            value = float(value)
        low, high = meta["low"], meta["high"]
        if low is not None and (value < low or (meta["low_open"] and value == low)):
            raise bad
        if high is not None and (value > high or (meta["high_open"] and value == high)):
            raise bad
        return value
    if kind is str:
        if not isinstance(value, str) or (meta["choices"] and value not in meta["choices"]):
            raise bad
        if meta.get("date"):
            try:
                np.datetime64(value, "us")
            except ValueError:
                raise bad from None
        return value
    if not isinstance(value, kind):
        raise bad
    return value


# How messages name a method's parameters ("HRNet parameter w must be ..."), by registry key; a method not listed is
# named by its key. The one mapping between the two spellings.
LABELS = {"privtrace": "PrivTrace", "hrnet": "HRNet", "pategail": "PateGail"}


class Config:
    """Base of the per-method config dataclasses (see the module docstring).

    ``method`` is the method's registry key (:data:`duckmob.synth.METHODS`, lowercase); messages name it by
    :meth:`label`. ``MACHINE`` names the settings of the machine a fit runs on (where it computes, with how many
    threads or processes, whether it shows progress), not of the model: a stored model never holds them
    (:meth:`stored_dict`), and a loaded one takes their defaults (:meth:`restored`), whatever machine stored it."""

    method: ClassVar[str] = "method"
    MACHINE: ClassVar[tuple[str, ...]] = ("device", "threads", "progress", "workers")

    @classmethod
    def label(cls) -> str:
        """The method's name in messages (:data:`LABELS`)."""
        return LABELS.get(cls.method, cls.method)

    @classmethod
    def parse(cls, params: dict[str, Any] | None = None, **defaults):
        """A validated config from user ``params``; ``defaults`` replace the class defaults (the method's own)."""
        params = dict(params or {})
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(params) - set(fields))
        if unknown:
            raise DuckmobError(f"unknown {cls.label()} parameter(s) {unknown}: known ones are {sorted(fields)}")
        values = {}
        for name, f in fields.items():
            if name in params and params[name] is not None:
                values[name] = _coerce(name, params[name], f.metadata, cls.label())
            elif name in defaults:
                values[name] = _coerce(name, defaults[name], f.metadata, cls.label())
        config = cls(**values)
        config.check()
        return config

    def check(self) -> None:
        """Checks across fields (override); raise DuckmobError."""

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)

    def stored_dict(self) -> dict[str, Any]:
        """The fields a stored model keeps (and its description shows): all but the :data:`MACHINE` settings."""
        return {name: value for name, value in self.as_dict().items() if name not in self.MACHINE}

    def off_machine(self):
        """This config with every :data:`MACHINE` setting at its default: what a stored model is loaded with."""
        defaults = {f.name: f.default for f in dataclasses.fields(self) if f.name in self.MACHINE}
        return self.replace(**defaults)

    @classmethod
    def restored(cls, stored: dict[str, Any]):
        """The config of a stored model's config dict: parsed like a user's (so it is checked again), any
        :data:`MACHINE` setting an older model kept ignored (the defaults: a model samples where it is loaded)."""
        return cls.parse({name: value for name, value in stored.items() if name not in cls.MACHINE})
