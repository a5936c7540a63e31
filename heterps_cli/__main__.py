from heterps_cli import main

main()
