from casmoe.cli import main

main()
