"""`python -m beast.plot`: the command lives in beast/outputs/plot.py."""

from beast.outputs.plot import main

if __name__ == "__main__":
    raise SystemExit(main())
