"""What `dinrec train` exits with when it did not finish, read by whatever runs it (the spot agent and
supervisor relaunch on it; retrain reports it)."""

EXIT_INTERRUPTED = 75  # EX_TEMPFAIL: "try again" — stopped by a signal after a checkpoint
