"""The `dinrec` command: composes each package's sub-commands, and the demo that runs them all."""
