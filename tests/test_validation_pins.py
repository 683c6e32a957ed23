"""Argument checks pinned one by one (CPU, no GPU needed).

Session 64's mutation-testing pass changed one check at a time (a comparison flipped, a tensor dropped from a
device or overlap check, a raise deleted) and ran the CPU tests: 33 of 48 such changes went unnoticed, most of
them checks that stand between a bad argument and a silent wrong answer or a corrupted buffer (shape agreement,
overlapping in-place arguments, strides, 32-bit extents, grid limits).  Each test here fails with its check
changed that way and passes with the check as written (both were run); the other test files hold the rest
(the fast path's two, in test_qknorm.py beside its stand-in tensor).
"""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import cute_kernels
from cute_kernels.kernels import hc_mix, qknorm, qknorm_tp
from cute_kernels.kernels import ranker_bwd as rb
from cute_kernels.kernels import ranker_fwd as rf
from cute_kernels.kernels import scale
from cute_kernels.runtime import validate
from ranker_fwd_stand_in import stand_in_forward
from test_ranker_bwd import _bf16_args  # (the backward tests' bf16 arguments: tests/ is on sys.path)

BF = torch.bfloat16


def meta(*shape, dtype=BF):
    return torch.empty(*shape, dtype=dtype, device="meta")


# ---- runtime/validate.py ------------------------------------------------------------------------------------

def test_two_rows_with_a_misaligned_row_stride_are_refused():
    x = torch.zeros(2, 12, dtype=torch.float16)[:, :8]  # 2 rows, 24 bytes apart: 16-byte loads would misalign
    with pytest.raises(ValueError, match="stride 12 in dim 0"):
        validate.check_tensor("x", x, cuda=False)


def test_two_overlapping_rows_are_refused():
    q = torch.zeros(72, dtype=BF).as_strided((2, 64), (8, 1))  # row 1 overlaps row 0 (in place: corrupted)
    with pytest.raises(ValueError, match="rows overlap"):
        qknorm.validate_qk_args(q, torch.zeros(2, 64, dtype=BF), torch.ones(64, dtype=BF), torch.ones(64, dtype=BF),
                                1e-6, cuda=False)


def test_an_output_sharing_only_the_last_element_of_an_input_is_refused():
    """dq's first bytes are the bounds' last int32 (the byte extent's last element counts)."""
    q, k, v, out, lse, do, _ = _bf16_args()
    big = torch.zeros(8 + q.numel() // 2 + 16, dtype=torch.int32)
    bounds = big[1:9].view(2, 4)  # bytes 4..36
    bounds.copy_(torch.tensor([[0, 5, 5, 9]] * 2))
    dq = big[8:8 + q.numel() // 2].view(BF).view(q.shape)  # from byte 32: bounds[1, 3]
    assert dq.data_ptr() % 16 == 0
    with pytest.raises(ValueError, match="dq shares memory with bounds"):
        rb._validate_backward(q, k, v, out, lse, do, bounds, None, None, "tanh", None, None, cuda=False, dq=dq)


def test_an_output_sharing_one_bf16_element_with_an_input_is_refused():
    big = torch.zeros(64, dtype=BF)
    with pytest.raises(ValueError, match="dq shares memory with q"):
        validate.check_outputs_disjoint(dict(dq=big[15:31]), dict(q=big[:16]))  # both hold big[15]
    validate.check_outputs_disjoint(dict(dq=big[16:32]), dict(q=big[:16]))  # adjacent: taken


def test_eps_just_below_float32s_smallest_normal_is_refused():
    validate.check_f32_eps("eps", 2.0 ** -126)
    with pytest.raises(ValueError, match="smallest normal"):
        validate.check_f32_eps("eps", 2.0 ** -127)  # subnormal: the kernels flush it to 0


# ---- scale --------------------------------------------------------------------------------------------------

def test_scale_refuses_padded_rows_and_partial_vectors():
    with pytest.raises(ValueError, match="x must be contiguous"):
        scale._fake(meta(4, 16)[:, :8], 2.0)
    with pytest.raises(ValueError, match="multiple of 8"):
        scale._fake(meta(12), 2.0)
    with pytest.raises(ValueError, match="multiple of 4"):
        scale._fake(meta(6, dtype=torch.float32), 2.0)


# ---- ranker forward -----------------------------------------------------------------------------------------

def _fwd_args(**kw):
    args = dict(q=torch.zeros(2, 64, 4, 128, dtype=BF), k=torch.zeros(2, 64, 2, 128, dtype=BF),
                v=torch.zeros(2, 64, 2, 128, dtype=BF), bounds=torch.zeros(2, 4, dtype=torch.int32),
                softmax_scale=None, cap=None, cap_method="tanh", cu_seqlens=None, max_seqlen=None, cuda=False)
    args.update(kw)
    return args


def _packed_args(**kw):
    return _fwd_args(**{**dict(q=torch.zeros(16, 4, 64, dtype=BF), k=torch.zeros(16, 2, 64, dtype=BF),
                               v=torch.zeros(16, 2, 64, dtype=BF), cu_seqlens=torch.tensor([0, 5, 16], dtype=torch.int32)),
                            **kw})


@pytest.mark.parametrize("kv, packed, message", [
    (torch.zeros(2, 64, 2, 64, dtype=BF), False, "q and k head dims differ"),
    (torch.zeros(2, 64, 0, 128, dtype=BF), False, "with Hkv >= 1"),  # (was a ZeroDivisionError)
    (torch.zeros(1, 64, 2, 128, dtype=BF), False, "must share batch and sequence sizes"),
    (torch.zeros(12, 2, 64, dtype=BF), True, "same total length"),
], ids=["head-dim", "no-kv-heads", "batch", "packed-length"])
def test_forward_k_and_v_must_agree_with_q(kv, packed, message):
    args = (_packed_args if packed else _fwd_args)(k=kv, v=kv.clone())
    with pytest.raises(ValueError, match=message):
        rf._validate(**args)


def test_forward_bounds_must_be_compact():
    with pytest.raises(ValueError, match="bounds must be contiguous"):  # the kernel reads them compact
        rf._validate(**_fwd_args(bounds=torch.zeros(2, 8, dtype=torch.int32)[:, :4]))


def test_forward_trace_time_device_check_includes_cu_seqlens():
    with pytest.raises(ValueError, match="different devices"):
        rf._fake(meta(16, 2, 64), meta(16, 2, 64), meta(16, 2, 64), meta(2, 4, dtype=torch.int32),
                 cu_seqlens=torch.tensor([0, 5, 16], dtype=torch.int32), max_seqlen=11)


def test_forward_cu_seqlens_first_difference_is_checked():
    with pytest.raises(ValueError, match=r"non-decreasing: cu_seqlens\[1\]=-3 < cu_seqlens\[0\]=0"):
        rf._check_cu_seqlens_values(torch.tensor([0, -3, 16], dtype=torch.int32), 16)


def test_forward_work_tile_limit_is_exact():
    rf._check_tile_count(128 * 2**30, 128, 1, 1)  # 2^30 tiles: taken
    with pytest.raises(ValueError, match=r"2\^30 work tiles"):
        rf._check_tile_count(128 * (2**30 + 1), 128, 1, 1)  # one more: tile + gridDim.x would pass 2^31
    with pytest.raises(ValueError, match=r"2\^30 work tiles"):
        rf._check_tile_count(128 * 2**30 // 8 + 1, 128, 4, 2)  # one row past whole tiles: a partial tile counts


def test_forward_softmax_scale_just_below_float32s_smallest_normal_is_refused():
    rf._check_scalars(2.0 ** -126, None, "none")
    rf._check_scalars(0.0, None, "none")  # 0: uniform attention over the admitted keys
    with pytest.raises(ValueError, match="smallest normal"):
        rf._check_scalars(2.0 ** -127, None, "none")  # subnormal: the kernels flush it to 0


@pytest.fixture
def stand_in_kernel(monkeypatch):
    """ranker_attention on CPU tensors with a recording stand-in for the compiled function
    (:func:`ranker_fwd_stand_in.stand_in_forward`)."""
    return stand_in_forward(monkeypatch)


def test_a_kept_launch_plan_is_not_reused_for_another_k_or_bounds(stand_in_kernel):
    """The eager plan skips the checks: its key must hold k's shape (keys, GQA ratio) and the bounds' shape."""
    q, bounds = torch.zeros(2, 64, 2, 128, dtype=BF), torch.tensor([[0, 5, 5, 9]] * 2, dtype=torch.int32)
    rf.ranker_attention(q, q, q, bounds)  # keeps a plan
    assert len(rf._PLANS) == 1
    short = torch.zeros(2, 64, 2, 128, dtype=BF)[:, :32]  # half the keys, q's strides: the plan would read past
    with pytest.raises(ValueError, match="must share batch and sequence sizes"):
        rf.ranker_attention(q, short, short, bounds)
    one_head = torch.zeros(2, 64, 2, 128, dtype=BF)[:, :, :1]  # q's strides, GQA ratio 2: compiled for 2
    rf.ranker_attention(q, one_head, one_head, bounds)
    assert stand_in_kernel[-1][0][2] == 2  # (_compile's qhead_per_kvhead)
    with pytest.raises(ValueError, match=r"bounds must have shape \[2, 4\]"):  # one row for B = 2
        rf.ranker_attention(q, q, q, bounds[:1])


def test_a_config_of_another_head_dim_is_refused(stand_in_kernel):
    q = torch.zeros(1, 64, 2, 128, dtype=BF)
    with pytest.raises(ValueError, match="config.head_dim=64 does not match the inputs' head dim 128"):
        rf._ranker_impl(q, q, q, torch.tensor([[0, 5, 5, 9]], dtype=torch.int32), None, None, "tanh", None, None,
                        config=rf.CONFIGS[64])


# ---- ranker backward ----------------------------------------------------------------------------------------

def test_backward_grid_limits_are_exact():
    hq = 65536  # query heads: one past CUDA's grid y/z limit
    q, k = meta(1, 8, hq, 64), meta(1, 8, 1, 64)
    with pytest.raises(ValueError, match="65535 query heads"):
        rb._validate_backward(q, k, k, q, meta(1, hq, 8, dtype=torch.float32), q, meta(1, 4, dtype=torch.int32),
                              None, None, "tanh", None, None, cuda=False, pointers=False)
    t = 65536  # one-token sequences
    q, cu, bounds = meta(t, 2, 64), meta(t + 1, dtype=torch.int32), meta(t, 4, dtype=torch.int32)
    with pytest.raises(ValueError, match="at most 65535 sequences"):
        rb._validate_backward(q, q, q, q, meta(2, t, dtype=torch.float32), q, bounds, None, None, "tanh", cu, 1,
                              cuda=False, pointers=False)
    n = t - 1
    rb._validate_backward(q[:n], q[:n], q[:n], q[:n], meta(2, n, dtype=torch.float32), q[:n], bounds[:n], None, None,
                          "tanh", cu[:n + 1], 1, cuda=False, pointers=False)  # 65535: taken


def test_backward_outputs_on_another_device_are_refused(monkeypatch):
    """Fake CUDA tensors (the Hopper query stubbed): dq on cuda:1 beside the rest on cuda:0; and a CPU dlse
    beside meta tensors at trace time."""
    monkeypatch.setattr(validate, "check_device", lambda device: None)
    with FakeTensorMode():
        def c(*s, dtype=BF, dev="cuda:0"):
            return torch.empty(*s, dtype=dtype, device=dev)

        q, lse, bounds = c(1, 8, 2, 64), c(1, 2, 8, dtype=torch.float32), c(1, 4, dtype=torch.int32)
        rb._validate_backward(q, q, q, q, lse, q, bounds, None, None, "tanh", None, None, pointers=False,
                              dq=c(1, 8, 2, 64))
        with pytest.raises(ValueError, match="different devices"):
            rb._validate_backward(q, q, q, q, lse, q, bounds, None, None, "tanh", None, None, pointers=False,
                                  dq=c(1, 8, 2, 64, dev="cuda:1"))
    q, lse, bounds = meta(1, 8, 2, 64), meta(1, 2, 8, dtype=torch.float32), meta(1, 4, dtype=torch.int32)
    with pytest.raises(ValueError, match="different devices"):
        rb._validate_backward(q, q, q, q, lse, q, bounds, None, None, "tanh", None, None, cuda=False,
                              pointers=False, dlse=torch.zeros(1, 2, 8))


def test_backward_outputs_aliasing_lse_or_dlse_are_refused():
    q, k, v, out, lse, do, bounds = _bf16_args()
    big = torch.zeros(q.numel() * 2 // 4 + 64)
    lse_in_big = big[:lse.numel()].view(lse.shape)
    dq = big.view(BF)[:q.numel()].view(q.shape)  # dq's bytes start at lse's first byte
    with pytest.raises(ValueError, match="dq shares memory with lse"):
        rb._validate_backward(q, k, v, out, lse_in_big, do, bounds, None, None, "tanh", None, None, cuda=False, dq=dq)
    dk = torch.zeros_like(k)
    dlse = dk.view(-1).view(torch.float32)[:lse.numel()].view(lse.shape)  # read while dk is written
    with pytest.raises(ValueError, match="dk shares memory with dlse"):
        rb._validate_backward(q, k, v, out, lse, do, bounds, None, None, "tanh", None, None, cuda=False,
                              dk=dk, dlse=dlse)


def test_backward_lse_with_padded_rows_is_refused():
    q, k, v, out, lse, do, bounds = _bf16_args()
    padded = torch.zeros(*lse.shape[:-1], lse.shape[-1] + 3)[..., :lse.shape[-1]]  # last dim contiguous
    with pytest.raises(ValueError, match="lse must be contiguous"):
        rb._validate_backward(q, k, v, out, padded, do, bounds, None, None, "tanh", None, None, cuda=False)


# ---- Q/K RMSNorm --------------------------------------------------------------------------------------------

def test_qknorm_k_past_32_bit_offsets_is_refused():
    k = torch.empty_strided((3, 1024), (2**30, 1), device="meta", dtype=BF)
    with pytest.raises(ValueError, match="k spans .*32-bit offsets"):
        qknorm.validate_qk_shapes(meta(3, 4096), k, meta(4096), meta(1024), 1e-6, cuda=False)


def test_qknorm_k_weight_of_another_length_is_refused():
    q, k, wq, wk = torch.zeros(4, 128, dtype=BF), torch.zeros(4, 64, dtype=BF), torch.ones(128, dtype=BF), torch.ones(64, dtype=BF)
    with pytest.raises(ValueError, match=r"k_weight must have shape \[64\]"):
        qknorm.validate_qk_args(q, k, wq, wk[:32], 1e-6, cuda=False)


def test_qknorm_k_between_q_rows_must_not_reach_them():
    w = lambda n: torch.ones(n, dtype=BF)  # noqa: E731
    buf = torch.zeros(6, 128, dtype=BF)
    q = buf[:4, :64]  # rows 128 elements apart: gaps of 64
    k_fits = buf.view(-1)[64:].as_strided((4, 64), (128, 1))
    qknorm.validate_qk_args(q, k_fits, w(64), w(64), 1e-6, cuda=False)  # k in the gaps: fine
    k_wide = buf.view(-1)[64:].as_strided((4, 96), (128, 1))  # starts in a gap, runs into q's next row
    k_other_stride = buf.view(-1)[64:].as_strided((4, 64), (192, 1))  # its row 1 is q's row 2
    for k in (k_wide, k_other_stride):
        with pytest.raises(ValueError, match="q and k overlap"):
            qknorm.validate_qk_args(q, k, w(64), w(k.shape[1]), 1e-6, cuda=False)


def test_tp_qknorm_more_than_8_ranks_check_the_k_width_at_construction():
    with pytest.raises(ValueError, match="16-byte"):
        qknorm_tp._config_for_world(16, 4096, 16 * 12, BF)  # 12 k columns per rank: not whole 16-byte vectors


# ---- mHC ----------------------------------------------------------------------------------------------------

def test_hc_mix_shapes_and_row_limit():
    f32 = torch.float32
    for method in ("tma", "walk"):
        with pytest.raises(ValueError, match="positive multiple of 64"):
            cute_kernels.hc_mix_sinkhorn(meta(4, 0), meta(24, 0, dtype=f32), meta(3, dtype=f32), meta(24, dtype=f32),
                                         method=method)
    with pytest.raises(ValueError, match=r"hc_scale must have shape \[3\]"):
        cute_kernels.hc_mix_sinkhorn(meta(4, 64), meta(24, 64, dtype=f32), meta(2, dtype=f32), meta(24, dtype=f32))
    rest = (meta(24, 64, dtype=f32), meta(3, dtype=f32), meta(24, dtype=f32))
    cute_kernels.hc_mix_sinkhorn(meta(hc_mix.MAX_ROWS, 64), *rest)  # the most rows: taken
    with pytest.raises(ValueError, match=f"at most {hc_mix.MAX_ROWS} supported"):
        cute_kernels.hc_mix_sinkhorn(meta(hc_mix.MAX_ROWS + 1, 64), *rest)


def test_a_single_allowed_dtype_reads_as_one():
    """'expected int32', not 'expected one of int32' (session 71's newcomer)."""
    from cute_kernels.runtime.validate import check_tensor

    with pytest.raises(TypeError, match=r"x has dtype int64; expected int32$"):
        check_tensor("x", torch.zeros(2, dtype=torch.int64), dtypes=(torch.int32,))
    with pytest.raises(TypeError, match=r"x has dtype int64; expected one of int32, float32$"):
        check_tensor("x", torch.zeros(2, dtype=torch.int64), dtypes=(torch.int32, torch.float32))


def test_bench_shapes_with_an_empty_word():
    from cute_kernels import registry

    for spec in ("+", "headline+", "headline++peers"):
        with pytest.raises(ValueError, match="has an empty word"):
            registry.word_spec("ranker_fwd", spec, ("headline", "peers"), "headline")
    assert registry.word_spec("ranker_fwd", " headline + peers ", ("headline", "peers"), "headline") == {
        "headline", "peers"}
