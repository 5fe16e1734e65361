"""The model registry: immutable versions and movable aliases on the storage layer (store), and the
`dinrec models` commands (cli)."""
