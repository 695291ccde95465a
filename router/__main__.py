import sys

from router.server import main

sys.exit(main())
