"""Synthesizers: one module or package per method behind one interface (base.py), found by name here.

``METHODS`` maps a method name (what ``method := '...'`` takes in SQL) to ``'module:Class'`` of its
:class:`~duckmob.synth.base.Synthesizer`; the module is imported only when the method is used, so a method's
heavy dependencies (torch for HRNet) are not loaded by the others. Keep it a plain dict: add a line per method.
"""

from __future__ import annotations

import json
from importlib import import_module

from duckmob.errors import DuckmobError

METHODS: dict[str, str] = {
    "privtrace": "duckmob.synth.privtrace:PrivTrace",
    "hrnet": "duckmob.synth.hrnet:HRNet",
    "baseline": "duckmob.synth.hrnet:Baseline",
    "pategail": "duckmob.synth.pategail:PateGail",
    "cleanslate": "duckmob.synth.cleanslate:CleanSlate",
}


def get(method: str):
    """The Synthesizer class of ``method`` (case-insensitive); DuckmobError naming the known methods if none."""
    name = str(method).strip().lower() if method is not None else ""
    if name not in METHODS:
        raise DuckmobError(f"unknown synthesis method {method!r}: use one of {', '.join(sorted(METHODS))} "
                           "(method := 'privtrace')")
    module, _, attr = METHODS[name].partition(":")
    return getattr(import_module(module), attr)


def model_class(method: str):
    """The Model class that ``method``'s fits produce (``Synthesizer.model_class``), for loading stored models."""
    return get(method).model_class


def parse_params(params) -> dict:
    """Method hyper-parameters from a JSON object string, a dict, or None."""
    if params is None or (isinstance(params, str) and not params.strip()):
        return {}
    if isinstance(params, dict):
        return dict(params)
    try:
        value = json.loads(params)
    except (TypeError, ValueError):
        raise DuckmobError(f"params must be a JSON object such as '{{\"K\": 8}}' or a STRUCT {{'K': 8}}, "
                           f"got {params!r}") from None
    if not isinstance(value, dict):
        raise DuckmobError(f"params must be a JSON object such as '{{\"K\": 8}}', got {params!r}")
    return value
