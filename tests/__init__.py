"""The test suite (a regular package, so that no installed `tests` package shadows it)."""
