from heterps_cli.cli import main

main()
