"""`python3 -m tailcut.pool`: see tailcut.pool._cli."""

import sys

from tailcut.pool._cli import main

sys.exit(main())
