import sys

from compressor.run.cli import main

sys.exit(main())
