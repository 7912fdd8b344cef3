"""``python -m pulsar`` runs the CLI."""

import sys

from pulsar.tools.cli import main

sys.exit(main())
