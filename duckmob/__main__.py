"""``python -m duckmob``: the duckmob shell (:func:`duckmob.cli.main`)."""

from duckmob.cli import main

raise SystemExit(main())
