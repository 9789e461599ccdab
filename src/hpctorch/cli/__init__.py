"""The command line: ``main`` (one handler per subcommand, errors as one line), ``parser``
(every subcommand's options, a bad command line as one line) and ``torchrun`` (torchrun's
options, under their names and meanings).

May import every stage; nothing imports it but ``__main__``.
"""
