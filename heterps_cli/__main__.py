from heterps_cli.cli.entry import main

main()
