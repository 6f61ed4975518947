"""mpifc command line (placeholder until the foundation issue's CLI lands)."""
import sys


def main(argv=None) -> int:
    print("mpifc: CLI not yet available", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
