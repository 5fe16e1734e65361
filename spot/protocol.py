"""The contract between a spot job and the command it runs: exiting with EXIT_INTERRUPTED means "stopped
by a signal after a checkpoint; relaunch me" — `dinrec train` exits with it, the spot agent and supervisor
relaunch on it, retrain reports it."""

EXIT_INTERRUPTED = 75  # EX_TEMPFAIL: "try again" — stopped by a signal after a checkpoint
