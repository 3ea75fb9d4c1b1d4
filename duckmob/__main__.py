from duckmob.cli import main

raise SystemExit(main())
