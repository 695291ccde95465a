import sys

from target_service.server import main

sys.exit(main())
