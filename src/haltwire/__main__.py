from haltwire.cli import main

main()
