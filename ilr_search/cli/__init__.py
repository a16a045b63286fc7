"""The `ilr-search` command line: main.py (the typer app), ui.py (what is printed), live.py (progress meanwhile)."""
