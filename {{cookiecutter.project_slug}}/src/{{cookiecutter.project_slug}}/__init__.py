"""Training package of this project; start with `cli.py` to see the commands."""

__version__ = "0.1.0"
