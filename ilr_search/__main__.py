from ilr_search.cli.main import console_main

console_main()
