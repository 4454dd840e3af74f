"""``python -m prefixshield.cli``: the command line (same as the ``prefixshield`` script)."""

from prefixshield.cli import main

if __name__ == "__main__":
    main()
