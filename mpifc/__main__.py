"""``python -m mpifc``: the same as the ``mpifc`` console script."""
import sys

from mpifc.cli import main

if __name__ == "__main__":
    sys.exit(main())
