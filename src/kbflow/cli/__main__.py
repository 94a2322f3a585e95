from kbflow.cli.main import main

main()
