from sglang_overlap.cli.main import main

raise SystemExit(main())
