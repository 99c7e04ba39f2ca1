"""``python -m attnlab`` runs the command line."""

import sys

from attnlab.cli import main

sys.exit(main())
