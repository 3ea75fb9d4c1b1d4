"""The release report: one self-contained HTML page per release, for the person who decides whether a synthetic
table may be published (``FROM mob_report('synth', path := 'report.html')``, :func:`duckmob.report`,
``duckmob report DB --synth synth -o report.html``).

Two audiences, decided by what the report reads. Without the real table it is the publishable page, built from
the release alone: the ledger row, the source's budget, the recorded output and stored model (public
descriptions), the synthetic table and public parameters. With ``real`` it adds the comparison with the real
table (every ``mob_evaluate`` metric with its two anchors, real-vs-real and a naive baseline, and a verdict; real
pictures beside the synthetic ones) under a banner saying it must not be published.

Modules: ``collect`` (the facts), ``pictures`` (PNG bytes), ``words`` (the guarantee in plain words),
``compare`` (the owner's comparison), ``render`` (HTML), ``build`` (the page and :class:`Report`).
"""

from __future__ import annotations

import sys
import types

from duckmob.report.build import Report, build

__all__ = ["Report", "build"]


class _Package(types.ModuleType):
    """This package, callable: ``duckmob.report(con, 'synth', ...)`` is :func:`duckmob.api.report` whether the name
    ``duckmob.report`` holds that function or, once this package was imported (Python then binds the package
    there), the package itself."""

    def __call__(self, *args, **kwargs):
        from duckmob.api import report

        return report(*args, **kwargs)


sys.modules[__name__].__class__ = _Package
