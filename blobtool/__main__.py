"""python -m blobtool: the same as the blobtool command."""

from .cli import main

if __name__ == "__main__":
    main()
