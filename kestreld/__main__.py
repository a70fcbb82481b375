from kestreld.cli import main

raise SystemExit(main())
