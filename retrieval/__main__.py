"""`python -m retrieval`: the `codeveil` command, for a checkout with no entry point."""

from retrieval.faces.cli import main

if __name__ == "__main__":
    main()
