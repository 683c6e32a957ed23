"""bench/summarize.py: the markdown tables written next to the bench records."""

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("summarize", Path(__file__).parents[1] / "bench" / "summarize.py")
summarize = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(summarize)


def test_attention_records_compare_with_the_fa4_peer():
    shape = {"b": 4, "h": 16}
    text = summarize.table([dict(impl="cute_kernels", shape=shape, mode="graph", time_us=100.0, tflops=600),
                            dict(impl="fa4_mask_mod", shape=shape, mode="graph", time_us=120.0, tflops=500),
                            dict(impl="flex", shape=shape, mode="graph", time_us=None, error="boom")])
    assert "| b=4,h=16 | cute_kernels | graph | 100.0 | 600 | 1.20x |" in text
    assert "error: boom" in text


def test_bandwidth_records_show_gbps_and_copy_fraction():
    text = summarize.table([dict(impl="cute_kernels", shape={"m": 4096, "k": 20480}, mode="graph", time_us=74.0,
                                 gbps=2267.4, copy_bw_frac=0.534)])
    assert "GB/s" in text and "useful TFLOP/s" not in text
    assert "| m=4096,k=20480 | cute_kernels | graph | 74.0 | 2267 | 53% |" in text
