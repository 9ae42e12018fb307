"""Entry point of a worker process: ``python -m segue._worker_main ... [--warm N]``.

A separate module, so that running it as ``__main__`` does not re-execute
``segue.run.worker``, which the package imports already. The import is inside
the guard: the sub-workers of a parallel data step (multiprocessing's "spawn")
import this module again as ``__mp_main__``, and must not pay for the worker's
imports (the checkpoint writer, NumPy) that they never use.

``--warm N`` (a data step with N fixed sub-workers) starts them before anything
else: forked once their entry point is imported, while this process has one thread
and no store open (segue.executor.local_warm).
"""

if __name__ == "__main__":
    import signal

    # Until the worker installs its handlers: a pause or "checkpoint now" that
    # arrives while it imports must not end it (their default action does).
    for _sig in (signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(_sig, signal.SIG_IGN)
    import sys

    if "--warm" in sys.argv:
        from segue.executor.local_warm import warm

        warm(int(sys.argv[sys.argv.index("--warm") + 1]))
    from segue.run.worker import main

    main()
