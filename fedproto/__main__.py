"""``python -m fedproto`` runs the command line."""

from fedproto.cli import main

raise SystemExit(main())
