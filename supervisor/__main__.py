# The first instruction of `python -m supervisor`: hold the daemon's signals before any import of
# ours (supervisor.common.sigmask says why; the loop releases them once its handlers are in).
import signal

signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGHUP, signal.SIGUSR2})

import sys  # noqa: E402

from supervisor.entry import main  # noqa: E402

sys.exit(main())
