"""`python -m beast.sweep`: the command lives in beast/tune/sweep.py."""

from beast.tune.sweep import main

if __name__ == "__main__":
    raise SystemExit(main())
