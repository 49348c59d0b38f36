"""`python -m floorguard` is the `floorguard` command."""

from floorguard.cli import main

raise SystemExit(main())
