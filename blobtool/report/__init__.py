"""What blobtool reports, and how it is shown; computes nothing about files.

- records.py: info, norm and compare results as JSON-ready dicts (what
  --json prints, and what the tables are drawn from);
- text.py: the tables' columns and rows, and the tables as plain text
  written without rich (off a terminal);
- tables.py: the same tables drawn with rich, histogram cells, pictures in
  the terminal;
- pictures.py: a blob as an RGB picture (heat map, colour image, filter grid).
- mapping.py: info --names torch's renaming, as a record and a table.

Nothing is imported here, so that the command line loads only what a
command draws.
"""
