"""``python -m spec.cli`` = ``minibert``."""

import sys

from spec.cli import main

sys.exit(main())
