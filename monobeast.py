"""MonoBeast: deep RL on one machine (any --algo).

    python monobeast.py --env PongNoFrameskip-v4
    python monobeast.py --mode test --xpid <run>

Flags: `python monobeast.py --help`. This file only parses flags and hands
over to beast.run.runner / beast.trained.play; bad input exits with status 2 and
one line saying what is wrong.
"""

from __future__ import annotations

from collections.abc import Sequence

PROG = "monobeast.py"


def main(argv: Sequence[str] | None = None) -> int:
    from beast.run.cli import run_entry_point
    from beast.run.parsing import parse_args

    def train(config) -> None:
        from beast.run.runner import train as train_monobeast

        train_monobeast(config)

    return run_entry_point(PROG, lambda: parse_args(argv, prog=PROG), train)


if __name__ == "__main__":
    from beast.run.cli import run_script

    run_script(PROG, main)
