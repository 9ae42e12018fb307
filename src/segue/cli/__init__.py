"""The `segue` command line (a thin shell over segue.run.ops)."""
