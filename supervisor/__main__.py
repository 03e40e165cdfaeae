import sys

from supervisor.entry import main

sys.exit(main())
