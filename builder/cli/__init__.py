"""The command line: parsing, one-line errors and table views; each command calls one function elsewhere."""
