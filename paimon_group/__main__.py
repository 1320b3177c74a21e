"""``python -m paimon_group`` is the ``paimon-group`` command."""

from paimon_group.cli import main

if __name__ == "__main__":
    main()
