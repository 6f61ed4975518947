"""``python -m mpifc.experiments NAME ...`` (until ``mpifc experiment`` is wired in)."""
import sys

from mpifc.experiments.main import main

sys.exit(main())
