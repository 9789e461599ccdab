"""The command line: ``main`` (argparse, one handler per subcommand, errors as one line) and
``torchrun`` (torchrun's options, under their names and meanings).

May import every stage; nothing imports it but ``__main__``.
"""
