from floorguard.cli import main

raise SystemExit(main())
