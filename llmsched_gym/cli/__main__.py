"""``python -m llmsched_gym.cli ARGS``: the same as ``llmsched ARGS``."""

import sys

from llmsched_gym.cli import main

sys.exit(main())
