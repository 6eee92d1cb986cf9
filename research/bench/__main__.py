"""``python -m research.bench VERB ...`` (see ``research.bench.cli``)."""

from research.bench.cli import main

raise SystemExit(main())
