"""What monobeast.py and polybeast.py share: exceptions to one-line errors and exit codes.

Exit 2 for bad input (flags, config files, an env that cannot be made), 1 for a run
that had to stop (TrainingError, CheckpointError), 130 after a Ctrl-C during start-up, 0
otherwise (a started run that Ctrl-C stops writes its final checkpoint and exits 0);
`--mode test` evaluates a checkpoint instead of training.
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Callable
from typing import NoReturn

from beast.util.interrupts import (
    hold_interrupts_during_start_up,
    raise_if_interrupt_held,
    release_held_interrupts,
)

__all__ = ["exit_process", "run_entry_point", "run_script"]


def run_script(prog: str, main: Callable[[], int]) -> NoReturn:
    """monobeast.py's and polybeast.py's `__main__`: hold Ctrl-C from here on (this
    module and beast/util/interrupts.py import only the standard library, so the hold
    comes before torch's import, inside which a KeyboardInterrupt aborts the process),
    run `main` (`run_entry_point`), and exit with its code. A second Ctrl-C while beast is
    still being imported is one line and exit 130."""
    hold_interrupts_during_start_up()  # until the run raises it
    try:
        code = main()
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        raise SystemExit(130) from None
    exit_process(code)


def exit_process(code: int) -> NoReturn:
    """End an entry point's process with `code` once its run is over (actors stopped,
    checkpoint written, logs closed): at once, even while a learner's compilation still
    runs in its thread, which the interpreter's exit would otherwise wait for (a stop
    never waits for a compilation, beast/train_step)."""
    from beast.train_step import compilations_under_way

    if compilations_under_way():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    # The interpreter's last garbage collection walks every object the run made and the
    # compiler's modules hold (0.9 s after a compiled DQN run): frozen, they are left to
    # the process's end, which frees them at once. Exit handlers still run.
    gc.freeze()
    sys.exit(code)


def run_entry_point(prog: str, parse: Callable[[], object], train: Callable[[object], None]) -> int:
    from beast.config import ConfigError
    from beast.envs import EnvError
    from beast.outputs.checkpoint import CheckpointError

    try:
        config = parse()
        raise_if_interrupt_held()  # a Ctrl-C during the imports or the env's probe
        if config.mode == "test":
            from beast.trained.play import test

            release_held_interrupts()
            test(config)
        else:
            from beast.run.runner import TrainingError

            try:
                train(config)
            except (TrainingError, CheckpointError) as error:
                print(f"{prog}: error: {error}", file=sys.stderr)
                return 1
    except (ConfigError, EnvError) as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # Before the run's own handling (a started run stops with a final checkpoint and
        # returns): one line, not the traceback of wherever start-up was.
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    return 0
