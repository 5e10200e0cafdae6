"""``python -m minibert_spec.cli`` = ``minibert``."""

import sys

from minibert_spec.cli import main

sys.exit(main())
