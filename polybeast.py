"""PolyBeast: deep RL across machines on Ray, with one or more learners.

    python polybeast.py --env PongNoFrameskip-v4                 # private Ray on 127.0.0.1
    python polybeast.py --env PongNoFrameskip-v4 --ray_address HEAD:6379 --num_env_servers 16
    python polybeast.py --mode test --xpid <run>

Flags: `python polybeast.py --help` (monobeast's, plus the cluster's). This
file only parses flags and hands over to beast.poly.trainer /
beast.trained.play; bad input exits with status 2 and one line saying what is
wrong. See docs/polybeast.md.
"""

from __future__ import annotations

from collections.abc import Sequence

PROG = "polybeast.py"


def main(argv: Sequence[str] | None = None) -> int:
    from beast.poly.config import parse_poly_args
    from beast.run.cli import run_entry_point

    def train(config) -> None:
        from beast.poly.trainer import train as train_polybeast

        train_polybeast(config)

    return run_entry_point(PROG, lambda: parse_poly_args(argv, prog=PROG), train)


if __name__ == "__main__":
    from beast.run.cli import run_script

    run_script(PROG, main)
