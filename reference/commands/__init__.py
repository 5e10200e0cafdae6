"""One module per ``minibert`` subcommand, each with ``register(subparsers)``."""
