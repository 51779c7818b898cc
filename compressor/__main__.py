import sys

from compressor.cli import main

sys.exit(main())
