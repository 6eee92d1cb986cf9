"""``python -m seqkv``: the ``seqkv`` command."""

import sys

from seqkv.cli import main

sys.exit(main())
