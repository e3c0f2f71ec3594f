import sys

from proflab.cli import main

sys.exit(main())
