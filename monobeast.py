"""MonoBeast: IMPALA on one machine.

    python monobeast.py --env PongNoFrameskip-v4
    python monobeast.py --mode test --xpid <run>

Flags: `python monobeast.py --help`. This file only parses flags and hands
over to beast.runner / beast.evaluate; bad input exits with status 2 and
one line saying what is wrong.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

PROG = "monobeast.py"


def main(argv: Sequence[str] | None = None) -> int:
    from beast.checkpoint import CheckpointError
    from beast.config import ConfigError, parse_args
    from beast.envs import EnvError

    try:
        config = parse_args(argv, prog=PROG)
        if config.mode == "test":
            from beast.evaluate import test

            test(config)
        else:
            from beast.runner import TrainingError, train

            try:
                train(config)
            except (TrainingError, CheckpointError) as error:
                print(f"{PROG}: error: {error}", file=sys.stderr)
                return 1
    except (ConfigError, EnvError) as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
