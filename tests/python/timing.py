"""Timing of a call that may raise one of the balancer's agreed errors."""
import time


def timed(fn):
    """(error type name, message, seconds) of fn(); (None, None, seconds) when
    it raises no ValueError or RuntimeError (the balancer's agreed errors)."""
    start = time.monotonic()
    try:
        fn()
    except (ValueError, RuntimeError) as e:
        return type(e).__name__, str(e), time.monotonic() - start
    return None, None, time.monotonic() - start
