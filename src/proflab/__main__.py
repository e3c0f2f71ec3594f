from proflab.cli import entry

entry()
