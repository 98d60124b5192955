"""``python -m bertflow`` runs the CLI (also what ``torchrun -m bertflow`` launches)."""

from bertflow.cli import main

main()
