"""Entry point of a worker process: ``python -m segue._worker_main ...``.

A separate module, so that running it as ``__main__`` does not re-execute
``segue.run.worker``, which the package imports already.
"""

from segue.run.worker import main

if __name__ == "__main__":
    main()
