from casmoe.cli import main

if __name__ == "__main__":  # not when a spawned sweep worker imports the parent's main module
    main()
