"""A step run on a side stream behind a long sleep: the tests that check an op launches on torch's current stream."""
import torch

SLEEP_CYCLES = 200_000_000  # torch.cuda._sleep's spin: ~0.1 s at an H100's / H200's ~2 GHz


def run_behind_a_sleep(step):
    """Run ``step()`` on a new side stream twice: once to fill that stream's memory pool (a first allocation there
    calls cudaMalloc, which can synchronize the device and so end the sleep early: session 69 saw it), then behind
    a ``torch.cuda._sleep`` issued on it, so that the inputs ``step`` writes on that stream exist only after the
    sleep and a kernel launched on another stream would read them before.  Returns what the second ``step()``
    returned, after synchronizing the side stream alone (work on the default stream first: its results are
    ``step``'s inputs).  Raises AssertionError if the side stream was idle when ``step`` returned: something in it
    waited for the device, so the test could not see a launch on the wrong stream (and an eager call that
    synchronizes is a finding of its own)."""
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        step()
    side.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(SLEEP_CYCLES)
        got = step()
        busy = not side.query()
    side.synchronize()
    assert busy, "the side stream's sleep was over when the step returned: something synchronized the device"
    return got
