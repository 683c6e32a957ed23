"""A step run on a side stream behind a long sleep: the tests that check an op launches on torch's current stream."""
import torch

SLEEP_CYCLES = 1_000_000_000  # torch.cuda._sleep's spin: ~0.5 s at an H100's / H200's ~2 GHz (a margin for
# a host slowed by other test processes: the step must return before it ends)


def _poisoned(t: torch.Tensor) -> torch.Tensor:
    return torch.full_like(t, float("nan"))


def _copied(t: torch.Tensor) -> torch.Tensor:
    return t.clone()


def run_behind_a_sleep(step):
    """``step(fill)`` writes its inputs as ``fill(tensor)`` and calls the op on them.  It runs on a new side stream
    twice: first with NaN-filled inputs, to fill that stream's memory pool (a first allocation there calls
    cudaMalloc, which can synchronize the device and so end the sleep early), then with copies of the real
    inputs, behind a ``torch.cuda._sleep`` issued on that stream: those copies exist only after the sleep, so a
    kernel launched on another stream reads the blocks as the first run left them (NaN inputs and their
    results: not the right answer; session 69 found that a first run on the real inputs left them in the
    reused blocks, where a wrong-stream launch read the right values).  Returns what the second run returned,
    after synchronizing the side stream alone (work on the default stream first: its results are ``step``'s
    inputs).  Raises AssertionError if the side stream was idle when ``step`` returned: something in it waited for
    the device, so the test could not see a launch on the wrong stream (and an eager call that synchronizes is a
    finding of its own)."""
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        step(_poisoned)
    side.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(SLEEP_CYCLES)
        got = step(_copied)
        busy = not side.query()
    side.synchronize()
    assert busy, "the side stream's sleep was over when the step returned: something synchronized the device"
    return got
