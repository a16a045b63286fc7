"""The `ilr-search` command line: main.py (the typer app) and ui.py (what is printed)."""
