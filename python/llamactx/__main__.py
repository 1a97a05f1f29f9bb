"""``python -m llamactx``: the command line."""

import sys

from llamactx.cli import main

sys.exit(main())
