from loadtests.chaos.cli import main

raise SystemExit(main())
