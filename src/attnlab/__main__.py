"""``python -m attnlab`` runs the command line."""

import sys

from attnlab.cli.app import main

sys.exit(main())
