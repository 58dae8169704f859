"""`python -m mixit ...` and `torchrun ... -m mixit ...`: the `mixit` command."""

import sys

from mixit.cli import main

sys.exit(main())
