"""How blobtool shows what it found (the records of blobtool.records); computes nothing about files.

- text.py: the tables' columns and rows, and the tables as plain text
  written without rich (off a terminal);
- tables.py: the same tables drawn with rich, histogram cells, pictures in
  the terminal;
- pictures.py: a blob as an RGB picture (heat map, colour image, filter grid);
  a mapped input's pages go back as its rows are drawn, when the call says
  so (blobtool.engine.work).
- legend.py: a heat map's PNG pixels with its colour bar and value range;
- mapping.py: info --names torch's renaming, as a record and a table.

Nothing is imported here, so that the command line loads only what a
command draws.
"""
