"""Helpers of the CPU tests that run host code in several threads at once (the thread-safety tests)."""

import contextlib
import inspect
import sys
import threading


def run_threads(target, args_list, switch_interval: float = 1e-6) -> None:
    """``target(*args)`` for each ``args`` of ``args_list``, in threads running at once, the interpreter switching
    between them every ``switch_interval`` seconds (to shake out interleavings); waits for all of them and restores
    the switch interval."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(switch_interval)
    try:
        threads = [threading.Thread(target=target, args=args) for args in args_list]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)


def line_of(fn, pick) -> int:
    """The file line number of the last line of ``fn``'s source whose stripped text ``pick`` accepts."""
    lines, first = inspect.getsourcelines(fn)
    return first + max(i for i, line in enumerate(lines) if pick(line.strip()))


@contextlib.contextmanager
def held_before(fn, lineno: int, body):
    """Run ``body()`` in a thread that stops (once) before it runs line ``lineno`` of ``fn``; the ``with`` block
    runs while it is held (as another thread would, at that moment), then the thread goes on and is joined."""
    code, held, go = fn.__code__, threading.Event(), threading.Event()

    def tracer(frame, event, arg):
        if event == "call":
            return tracer if frame.f_code is code else None
        if event == "line" and frame.f_lineno == lineno and not held.is_set():
            held.set()
            go.wait(10)
        return tracer

    def run():
        sys.settrace(tracer)
        try:
            body()
        finally:
            sys.settrace(None)

    t = threading.Thread(target=run)
    t.start()
    try:
        assert held.wait(10), f"the thread never reached line {lineno} of {fn.__qualname__}"
        yield
    finally:
        go.set()
        t.join(10)
