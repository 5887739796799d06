import sys

from g2rpo.cli import main

sys.exit(main())
