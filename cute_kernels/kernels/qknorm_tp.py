"""Fused Q/K RMSNorm across tensor-parallel ranks: push buffers between peers, one launch per rank.

Math (seed 000, sglang ``tp_qknorm.cuh`` after TensorRT-LLM): heads are sharded over G ranks, rank
``r`` holds ``q [N, Q/G]`` and ``k [N, K/G]``; every rank computes

    q = q * rsqrt(sum_over_ranks(sum(q^2)) / Q + eps) * q_weight      (same for k with K)

in float32.  Every rank adds the G partial sums in rank order 0..G-1, so all ranks get the same
scale bits.

Protocol (per token, per rank), with the seed's gaps closed:

* **push**: slot ``[epoch, token, rank]`` of every peer's buffer (its own included) is a 64-bit
  word (sum_q, sum_k); the q warps store the row's q partial sum into its low half and the k warps
  the k partial into its high half, each with a 32-bit ``st.relaxed.sys``;
* **poll**: each role spins with ``ld.relaxed.sys`` on its half of its own slots
  ``[epoch, token, 0..G-1]`` until none holds the sentinel, then writes the sentinel back (the
  slot is free for the launch after next).  The sentinel is -0.0 (bits 0x80000000) in each half:
  a sum of squares starts at +0.0 and never becomes -0.0, so a zero row with ``eps = 0`` still
  completes (the seed waited for a non-zero value and hung);
* **bounded wait**: a launch that waited ``timeout_ns`` (``%globaltimer``, counted from the start of
  each CTA, so every later slot gives up at once and a missing peer costs about one timeout per
  launch, not one per token tile) for a peer gives up, writes
  1 into an error word in pinned host memory and finishes the launch (the missing partial counts as
  0). ``ParallelQKNorm.check_error()`` raises on it, and every later call refuses to run until
  ``reset()`` (the buffers are then out of step);
* **epochs**: two buffers ``[2, capacity, G]`` alternate by launch.  A rank cannot run two launches
  ahead of a peer (its launch i+1 needs the peer's pushes of launch i+1, made after the peer's
  launch i drained its slots), so a slot is never overwritten before it is read.  Each epoch has
  ``capacity * G`` slots (the seed spaced its epochs by N*8 bytes for N*G*8 bytes of data); the host
  raises when N exceeds ``capacity``;
* **epoch counter with any N**: the epoch lives in device memory; the last CTA of a launch (an
  atomic count of finished CTAs) flips it, so launches with a different N (grid size) keep all
  ranks in step, also inside CUDA graphs;
* **residency**: the grid is ``min(ceil(N / rows), resident)`` CTAs that loop over token tiles,
  where ``resident`` = SMs x CTAs per SM (from the kernel's registers, threads and shared memory),
  halved for margin and divided by G when G ranks share one GPU (emulation), so every spinning CTA
  is resident.

The local part (16-byte vector loads, row reductions, scale and store) is the one-GPU kernel's
(:class:`cute_kernels.kernels.qknorm.QKRowNormalizer`).  The q warps and the k warps each run their own
exchange and never wait for each other: each role meets only on its own named barrier (1 for q, 2
for k, the barriers of its row reduction), so no barrier is shared between code paths.  (An earlier
version met on one CTA-wide barrier from both branches; racecheck reported a hazard on the shared
partials there, 2026-11-29.)

Spin-waiting kernels and CUDA lazy module loading: the first launch of any kernel may synchronize
the context; if that happens on a rank's host thread while its previous launch spins for a peer whose
launch is not enqueued yet, the wait ends at the timeout.  Launch every kernel once before (warm-up),
or set ``CUDA_MODULE_LOADING=EAGER`` (the same holds for any custom all-reduce).

Measured through the one-GPU emulation (H200, Q=4096, K=1024, bf16, all ranks' kernels of one call in
one CUDA graph; session 17 at the current code, bench/results/2026-11-30_h200_qknorm_tp_emulated_s17.json:
G=2 4.7 us (N=1), 5.5 (N=64), 94 (N=8192); G=4 5.3, 6.4, 93; G=8 only eagerly (see
:data:`GRAPH_MAX_EMULATED_G`).  Earlier (2026-11-29, before the exchange fixes e42e842 and
06f824b): G=4 5.4 us (N=1), 5.6 (N=64), 8.0 (N=512), 43 (N=4096), 91 (N=8192); G=2 / G=8 at N=64:
4.8 / 7.7 us.  The unfused torch path (sums, summed across ranks, scale) is 8-27x slower there.
"""

from __future__ import annotations

import itertools
import os
import secrets
import socket
import weakref
from dataclasses import dataclass
from typing import Any, NamedTuple

import cutlass
import cutlass.cute as cute
import torch
from cutlass import Float32, Int32, Int64, Uint32

from ..registry import CheckResult, CompileTarget
from ..runtime.cache import compile_cached, compile_record
from ..runtime.fake import cute_dtype, fake_stream, fake_tensor
from ..runtime.torch_op import custom_op
from ..runtime.validate import ValidatedConfig, check_int, check_real
from .qknorm import (DEFAULT_TUNING, DTYPES, SHIPPED_DIMS, QKNormConfig, QKNormTuning, QKRowNormalizer, fast_path_key,
                     bump_versions, check_eps, check_no_grad, launch_view, qk_rmsnorm_reference, validate_qk_args,
                     validate_qk_shapes, vec_elems)

NAME = "qknorm_tp"
SHIPPED_G = (2, 4, 8)
MAX_G = 8
SENTINEL = 0x8000000080000000  # (-0.0f, -0.0f)
SENTINEL_HALF = 0x80000000  # -0.0f, one role's half of a slot
_STATE_WORDS = 4  # [epoch, finished CTAs, unused, unused]
# The per-rank tiling's knobs: 4 vectors per thread, plain loads and stores (the kernel has none of the one-GPU
# kernel's persistent, bulk-staged or L2-prefetch paths)
TP_TUNING = QKNormTuning()


@dataclass(frozen=True)
class ParallelQKNormConfig(ValidatedConfig):
    """Static shape: the per-rank tiling (``QKNormConfig`` with the full Q/K) and the world size."""

    world: int
    norm: QKNormConfig

    @staticmethod
    def for_shape(world: int, q_dim: int, k_dim: int, dtype: torch.dtype) -> "ParallelQKNormConfig":
        """The config of ``world`` ranks sharing q rows of ``q_dim`` and k rows of ``k_dim`` elements (ints)
        of ``dtype``: ``TypeError`` / ``ValueError`` naming the argument, or the tiling's reason."""
        world = check_int("world", world, low=1, high=MAX_G)  # (plain ints from here)
        q_dim, k_dim = check_int("q_dim", q_dim), check_int("k_dim", k_dim)
        if q_dim % world or k_dim % world:
            raise ValueError(f"q_dim={q_dim} and k_dim={k_dim} must be divisible by the world size {world}")
        try:
            norm = QKNormConfig.for_shape(q_dim // world, k_dim // world, dtype, q_dim=q_dim, k_dim=k_dim,
                                          tuning=TP_TUNING)
        except ValueError as exc:  # the per-rank widths are what the tiling sees: name the full sizes too
            raise ValueError(f"q_dim={q_dim}, k_dim={k_dim} over {world} ranks (per-rank widths {q_dim // world} "
                             f"and {k_dim // world}): {exc}") from None
        return ParallelQKNormConfig(world, norm)

    def validate(self) -> None:
        if type(self.world) is not int:  # (exact, as every config's ints; for_shape passes a plain int)
            raise TypeError(f"ParallelQKNormConfig.world={self.world!r}: must be an int")
        check_int("world", self.world, low=1, high=MAX_G)
        if not isinstance(self.norm, QKNormConfig):
            raise TypeError(f"ParallelQKNormConfig.norm={self.norm!r}: must be a QKNormConfig")
        if (self.norm.q.width * self.world, self.norm.k.width * self.world) != (self.norm.q_dim, self.norm.k_dim):
            raise ValueError(f"per-rank widths {self.norm.q.width} and {self.norm.k.width} over {self.world} ranks are "
                             f"not the full sizes q_dim={self.norm.q_dim}, k_dim={self.norm.k_dim}")


class Exchange(NamedTuple):
    """What a CTA's push/poll exchange reads (:meth:`ParallelQKNormKernel.exchange_pair`; made once per CTA)."""

    mPeers: Any  # [G] int64: every rank's push buffer address (this rank's at index rank)
    error_addr: Any  # int64 address of the error flag (pinned host memory, written through UVA)
    rank: Any
    capacity: Any  # tokens per epoch of a buffer [2, capacity, G] of 64-bit slots
    epoch: Any  # this launch's epoch (0 or 1)
    timeout_ns: Any
    cta_start: Any  # %globaltimer at the CTA's start: its waits end timeout_ns after it
    sPart: Any  # [rows, 2] float32: this rank's partial sums (q, k) of the CTA's rows
    sSum: Any  # [rows, 2, G] float32: every rank's partials, in rank order


class ParallelQKNormKernel(QKRowNormalizer):
    """One rank's launch: local sums, push to every peer, poll own slots, scale in place."""

    def __init__(self, dtype: type[cutlass.Numeric], config: ParallelQKNormConfig):
        super().__init__(dtype, config.norm)
        self.world = config.world

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mWq: cute.Tensor, mWk: cute.Tensor,
                 mPeers: cute.Tensor, mState: cute.Tensor, error_addr: Int64, rank: Int32, capacity: Int32,
                 num_ctas: Int32, eps: Float32, timeout_ns: Int64, stream):
        self.kernel(mQ, mK, mWq, mWk, mPeers, mState, error_addr, rank, capacity, eps, timeout_ns).launch(
            grid=[num_ctas, 1, 1], block=[self.config.threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mQ: cute.Tensor, mK: cute.Tensor, mWq: cute.Tensor, mWk: cute.Tensor,
               mPeers: cute.Tensor, mState: cute.Tensor, error_addr: Int64, rank: Int32, capacity: Int32,
               eps: Float32, timeout_ns: Int64):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        cfg = self.config
        smem = cutlass.memory.SmemAllocator()
        sRed = smem.allocate_tensor(Float32, cute.make_layout(self.num_warps), byte_alignment=16)
        sPart = smem.allocate_tensor(Float32, cute.make_layout((cfg.rows, 2)), byte_alignment=16)
        sSum = smem.allocate_tensor(Float32, cute.make_layout((cfg.rows, 2, self.world)), byte_alignment=16)
        n = mQ.shape[0]
        num_tiles = (n + cfg.rows - 1) // cfg.rows
        epoch = cute.arch.load(mState.iterator, Int32, sem="relaxed", scope="gpu")
        cta_start = cute.arch.globaltimer()  # every wait of this CTA ends timeout_ns after this
        comm = Exchange(mPeers, error_addr, rank, capacity, epoch, timeout_ns, cta_start, sPart, sSum)
        if tidx < cfg.q_threads:
            for tile in cutlass.range(bidx, num_tiles, gdim):
                self.normalize_tile(mQ, mWq, self.q_role, tidx, tile, n, eps, sRed, comm)
        else:
            for tile in cutlass.range(bidx, num_tiles, gdim):
                self.normalize_tile(mK, mWk, self.k_role, tidx - cfg.q_threads, tile, n, eps, sRed, comm)
        self.advance_epoch(mState, epoch, tidx, gdim)

    @cute.jit
    def normalize_tile(self, mX: cute.Tensor, mW: cute.Tensor, role: cutlass.Constexpr, tidx: Int32, tile: Int32,
                       n: Int32, eps: Float32, sRed: cute.Tensor, comm):
        """One role (:class:`.qknorm.RowRole`: the q or the k threads; ``tidx`` counted within it): local partial
        sums -> ``sPart[row, role.which]``; this role's exchange (``comm``: :class:`Exchange`); rank-order
        total; scale."""
        part, which, barrier_id = role.part, role.which, role.barrier_id
        sPart, sSum = comm.sPart, comm.sSum
        role_threads = self.config.rows * part.threads
        tXgX, tXrX, tXrW, row_ok, col_ok = self.load_rows(mX, mW, part, tidx, tile, n)
        ss = self.row_sum_of_squares(tXrX, role, tidx, sRed)
        row = tidx // part.threads
        if tidx % part.threads == 0:
            sPart[row, which] = ss
        cute.arch.barrier(barrier_id=barrier_id, number_of_threads=role_threads)  # sPart[:, which] complete
        self.exchange(comm, tile, n, tidx, which, role_threads)
        cute.arch.barrier(barrier_id=barrier_id, number_of_threads=role_threads)  # sSum[:, which] complete
        total = sSum[row, which, 0]
        for g in cutlass.range_constexpr(1, self.world):  # rank order: same bits on every rank
            total = total + sSum[row, which, g]
        scale = cute.math.rsqrt(total * Float32(1.0 / role.dim) + eps, fastmath=True)
        self.scale_and_store(tXgX, tXrX, tXrW, scale, row_ok, col_ok, part)

    @cute.jit
    def exchange(self, comm, tile: Int32, n: Int32, tidx: Int32, which: cutlass.Constexpr,
                 role_threads: cutlass.Constexpr):
        """Role thread ``i`` takes the (row, g) pairs ``i, i + role_threads, ...``: it pushes the row's
        partial to rank g (half ``which`` of the slot) and polls rank g's partial in its own buffer."""
        cfg = self.config
        if cutlass.const_expr(cfg.rows * self.world <= role_threads):  # one pair per thread at most
            if tidx < cfg.rows * self.world:
                self.exchange_pair(comm, tile, n, tidx, which)
        else:
            for i in cutlass.range(tidx, cfg.rows * self.world, role_threads):
                self.exchange_pair(comm, tile, n, i, which)

    @cute.jit
    def exchange_pair(self, comm, tile: Int32, n: Int32, i: Int32, which: cutlass.Constexpr):
        """Pair ``i`` = (row ``i // G``, rank ``g = i % G``): push, poll, sentinel back, into ``sSum``."""
        cfg = self.config
        mPeers, rank, cta_start, timeout_ns = comm.mPeers, comm.rank, comm.cta_start, comm.timeout_ns
        row = i // self.world
        g = i % self.world
        token = tile * cfg.rows + row
        if token < n:
            # half ``which`` of slot [epoch, token, src] of a buffer [2, capacity, G] of 64-bit words
            slot = (Int64(comm.epoch) * Int64(comm.capacity) + Int64(token)) * self.world
            push_off = (slot + Int64(rank)) * 8 + 4 * which
            poll_off = (slot + Int64(g)) * 8 + 4 * which
            push_ptr = cute.make_ptr(Uint32, mPeers[g] + push_off, cute.AddressSpace.gmem, assumed_align=4)
            poll_ptr = cute.make_ptr(Uint32, mPeers[rank] + poll_off, cute.AddressSpace.gmem, assumed_align=4)
            cute.arch.store(push_ptr, comm.sPart[row, which].bitcast(Uint32), sem="relaxed", scope="sys")
            got = cute.arch.load(poll_ptr, Uint32, sem="relaxed", scope="sys")
            # the deadline is per CTA (from its start), not per slot: once it has passed, every later slot of
            # this CTA polls once and gives up, so a missing peer costs about timeout_ns per launch
            waited = cute.arch.globaltimer() - cta_start
            while (got == Uint32(SENTINEL_HALF)) & (waited < timeout_ns):
                got = cute.arch.load(poll_ptr, Uint32, sem="relaxed", scope="sys")
                waited = cute.arch.globaltimer() - cta_start
            if got == Uint32(SENTINEL_HALF):  # the peer never came: flag it, count its partial as 0
                err_ptr = cute.make_ptr(Int32, comm.error_addr, cute.AddressSpace.gmem, assumed_align=4)
                cute.arch.store(err_ptr, Int32(1), sem="relaxed", scope="sys")
                got = Uint32(0)
            else:
                cute.arch.store(poll_ptr, Uint32(SENTINEL_HALF), sem="relaxed", scope="sys")
            comm.sSum[row, which, g] = got.bitcast(Float32)

    @cute.jit
    def advance_epoch(self, mState: cute.Tensor, epoch: Int32, tidx: Int32, gdim: Int32):
        """The last CTA to finish flips the epoch for the next launch and rearms the counter."""
        cute.arch.barrier()
        if tidx == 0:
            done_ptr = mState.iterator + 1
            old = cute.arch.atomic_add(done_ptr, Int32(1), sem="acq_rel", scope="gpu")
            if old == gdim - 1:
                cute.arch.store(done_ptr, Int32(0), sem="relaxed", scope="gpu")
                cute.arch.store(mState.iterator, Int32(1) - epoch, sem="relaxed", scope="gpu")


# ----------------------------------------------------------------------------- host side

def _key(dtype: torch.dtype, world: int, q_dim: int, k_dim: int) -> tuple:
    return (str(dtype), world, q_dim, k_dim)


def _compile(dtype: torch.dtype, world: int, q_dim: int, k_dim: int):
    cfg = ParallelQKNormConfig.for_shape(world, q_dim, k_dim, dtype)

    def build():
        vec = vec_elems(dtype)
        qw, kw = q_dim // world, k_dim // world
        n = cute.sym_int()
        sq, sk = cute.sym_int(divisibility=vec), cute.sym_int(divisibility=vec)
        return ParallelQKNormKernel(cute_dtype(dtype), cfg), (
            fake_tensor(dtype, (n, qw), stride=(sq, 1)), fake_tensor(dtype, (n, kw), stride=(sk, 1)),
            fake_tensor(dtype, (qw,)), fake_tensor(dtype, (kw,)),
            fake_tensor(torch.int64, (world,)), fake_tensor(torch.int32, (_STATE_WORDS,)),
            Int64(0), Int32(0), Int32(1), Int32(1), Float32(1e-6), Int64(1), fake_stream())

    return compile_cached(NAME, _key(dtype, world, q_dim, k_dim), build)


def _shipped_kernels() -> list[tuple[str, torch.dtype, int, int, int]]:
    """``(label, dtype, world, Q, K)`` of every shipped kernel: each shipped (Q, K) and rank count G in bfloat16,
    one (Q, K, G) in the other dtypes (it keeps the CPU compile list short)."""
    return [(f"{str(dtype).replace('torch.', '')} G={g} Q={q_dim} K={k_dim}", dtype, g, q_dim, k_dim)
            for dtype in DTYPES for q_dim, k_dim in SHIPPED_DIMS for g in SHIPPED_G
            if dtype == torch.bfloat16 or (q_dim, g) == (4096, 4)]


def compile_targets() -> list[CompileTarget]:
    """The kernels of :func:`_shipped_kernels`, keyed as :func:`_compile` caches them."""
    return [CompileTarget(NAME, label, _key(dtype, g, q_dim, k_dim),
                          build=lambda d=dtype, g=g, q=q_dim, k=k_dim: _compile(d, g, q, k))
            for label, dtype, g, q_dim, k_dim in _shipped_kernels()]


def shipped_configs() -> dict[str, ParallelQKNormConfig]:
    """``{label: config}`` of the kernels of :func:`_shipped_kernels` (``cute-kernels configs``)."""
    return {label: ParallelQKNormConfig.for_shape(g, q_dim, k_dim, dtype)
            for label, dtype, g, q_dim, k_dim in _shipped_kernels()}


def ctas_per_sm(threads: int, registers: int | None, smem_bytes: int = 0) -> int:
    """CTAs of ``threads`` threads that fit on one Hopper SM (2048 threads, 228 KB smem, 64K registers in four
    sub-partitions of 16384, each holding whole warps: a warp's registers are allocated in units of 256)."""
    warps = -(-threads // 32)
    by_threads = 64 // warps
    regs_per_warp = -(-(registers or 255) * 32 // 256) * 256
    by_regs = 4 * (16384 // regs_per_warp) // warps
    by_smem = (228 * 1024) // (smem_bytes + 1024)
    return max(0, min(32, by_threads, by_regs, by_smem))


def resident_ctas(dtype: torch.dtype, world: int, q_dim: int, k_dim: int, ranks_per_gpu: int = 1,
                  device: torch.device | int | None = None) -> int:
    """Grid cap so every CTA of every rank sharing the GPU is resident (half the occupancy, for margin);
    ``device``: the GPU (None: the current one)."""
    _compile(dtype, world, q_dim, k_dim)
    cfg = ParallelQKNormConfig.for_shape(world, q_dim, k_dim, dtype)
    res = compile_record(NAME, _key(dtype, world, q_dim, k_dim)).resources
    regs = max((r.registers or 0) for r in res) if res else None
    smem = max((r.static_smem_bytes for r in res), default=0) + 4 * (cfg.norm.threads // 32 + 2 * cfg.norm.rows
                                                                      * (1 + world))
    per_sm = ctas_per_sm(cfg.norm.threads, regs, smem)
    gpu = torch.cuda.current_device() if device is None else device  # (0 is a device, not a default)
    sms = torch.cuda.get_device_properties(gpu).multi_processor_count
    return max(1, sms * max(1, per_sm // 2) // ranks_per_gpu)


class PeerTimeoutError(RuntimeError):
    """A rank waited longer than ``timeout_s`` for a peer's partial sums (a ``RuntimeError``).  Raised by
    :meth:`ParallelQKNorm.check_error`, and by the next call of the instance after a launch timed out
    (until :meth:`ParallelQKNorm.reset`)."""


# The custom op takes the instance as an int handle (torch ops cannot take Python objects); the
# registry is weak so that dropping a ParallelQKNorm frees it and its buffers.  Handles come from a
# counter (never reused, unlike id()), so a stale handle cannot name a newer instance.  The counter starts at
# a random 61-bit offset per process, so a handle recorded in one process (a torch.export program saved there)
# names no instance of another (until session 72 every process counted from 1, and such a program ran with
# whichever instance of the loading process had that number: another group's buffers).
_instances: "weakref.WeakValueDictionary[int, ParallelQKNorm]" = weakref.WeakValueDictionary()
_handles = itertools.count(secrets.randbits(61) + 1)
_TIMEOUT_NS_MAX = 2**63 - 1  # the kernel's Int64 nanoseconds


def _dtype_error(dtype) -> str:
    """The message for a ``dtype`` argument that is not one of :data:`DTYPES` (a string such as "bfloat16"
    included: the argument is a torch.dtype)."""
    names = ", ".join(f"torch.{str(d).replace('torch.', '')}" for d in DTYPES)
    what = "an unsupported torch.dtype" if isinstance(dtype, torch.dtype) else type(dtype).__name__
    return f"dtype must be a torch.dtype, one of {names}; got {what} {dtype!r}"


def _positive_int(name: str, value, upper: int = 2**63 - 1) -> int:
    return check_int(name, value, low=1, high=upper)


def _timeout_ns(timeout_s) -> int:
    """``timeout_s`` (seconds, a finite real > 0) as int64 nanoseconds (at least 1)."""
    t = check_real("timeout_s", timeout_s, low=0.0, low_open=True, high=float("inf"))
    ns = round(t * 1e9) if t <= _TIMEOUT_NS_MAX / 1e9 else _TIMEOUT_NS_MAX + 1  # (t * 1e9 may overflow to inf)
    if ns > _TIMEOUT_NS_MAX:
        raise ValueError(f"timeout_s={timeout_s!r} does not fit int64 nanoseconds (max ~{_TIMEOUT_NS_MAX / 1e9:.3g} s)")
    if ns < 1:
        raise ValueError(f"timeout_s={timeout_s!r} is below 1 ns")
    return ns


class ParallelQKNorm:
    """Fused Q/K RMSNorm across the heads of a tensor-parallel group (seed 000), in place.

    ``ParallelQKNorm(group, max_tokens, q_dim, k_dim, dtype)(q, k, q_weight, k_weight, eps)`` on
    every rank of ``group`` normalizes this rank's shards ``q [N, q_dim/G]``, ``k [N, k_dim/G]`` with
    the sums of squares over all ranks: ``q *= rsqrt(sum_all(q^2)/q_dim + eps) * q_weight``.  The sums are
    float32 (a row whose sum overflows comes out as zeros, as in :func:`.qknorm.qk_rmsnorm_`).

    Peer buffers (``[2 epochs, max_tokens, G]`` 64-bit slots per rank) come from torch symmetric
    memory, else CUDA IPC handles exchanged over ``group``.  When the ranks are not all P2P-reachable
    (several nodes), calls go through the unfused path: per-token sums, ``all_reduce``, scale.
    ``ParallelQKNorm.emulated(G, ...)`` builds G ranks on one GPU (tests and benchmarks).

    Export: a ``torch.export`` program records the instance as its handle (an int): it runs in the process
    that made it, with that instance; loaded in another process it names no instance there and its call raises
    ``RuntimeError`` (export again where it runs).

    Copies: ``copy.copy`` / ``copy.deepcopy`` (e.g. of a model holding it, for an EMA copy) return the object
    itself, which stands for this rank's share of the group's buffers (before session 69 a copy shared the
    original's handle, so closing either broke the other); pickling raises ``TypeError``.

    Serving code that runs under ``torch.inference_mode()`` may build it there: its buffers are made outside
    inference mode (normal tensors), so :meth:`reset` and calls work in and out of it (torch refuses in-place
    updates of inference tensors outside inference mode; before session 69 ``reset()`` raised so).

    Lifetime: the object owns its push buffer (and, in the emulation, references to its peers').
    Dropping the last reference frees it (the op's handle registry is weak); :meth:`close` (or a
    ``with`` block) frees the buffers now.  Close or drop it on every rank only after every rank's
    last call has finished (a peer still in flight pushes into this rank's buffer), and never while
    a captured CUDA graph that launches it may still be replayed.

    Args:
        group: a torch.distributed process group (or None for the default group).
        max_tokens: positive int (<= 2**31 - 1), the capacity; a call with more tokens raises ``ValueError``.
        q_dim, k_dim: positive ints, the full sizes Q and K: divisible by G, per-rank widths
            ``Q/G``, ``K/G`` multiples of 8 elements for 16-bit dtypes (4 for float32), and a pair the
            kernel's tiling takes (one rank: the one-GPU op's); checked on every rank, after the ranks have
            compared their arguments and before any buffer exchange.  Groups of more than 8 ranks always take
            the unfused path.
            GPU-tested: Q in {4096, 6144}, K=1024: G in {2, 4, 8} emulated on one GPU, G=2 on two GPUs
            (the full 2-GPU plan at this kernel's exchange, session 5: bench/results/tp_qknorm_2gpu_s5/) and
            G=4 on four (session 19: bench/results/tp_qknorm_4gpu_s19/); G=8 on eight GPUs not yet run.
        dtype: float16, bfloat16 or float32 (q, k and the weights).
        timeout_s: real number of seconds (default 10.0), finite, at least 1 ns once rounded to whole
            nanoseconds (so above 5e-10) and within int64 nanoseconds (~9.22e9 s): how long a rank waits for
            a peer before the launch gives up and flags an error.
    Raises:
        TypeError (construction): group neither a ProcessGroup nor None; dtype not supported;
            max_tokens / q_dim / k_dim not ints; timeout_s not a real number.
        ValueError (construction): non-positive sizes, unsupported widths (above), timeout_s not
            finite / below 1 ns / too large; ``group`` None while no default process group has been
            initialized (``torch.distributed.init_process_group``).  Construction itself needs no GPU (the
            host contract, e.g. :meth:`close` and copies, is CPU-tested over gloo): without CUDA it takes the
            unfused path, and its calls raise ``ValueError`` for the CPU tensors they get.
        Calls: ``ValueError``/``TypeError`` for bad arguments, ``PeerTimeoutError`` when an earlier
        launch timed out (see :meth:`check_error`, :meth:`reset`), ``RuntimeError`` after :meth:`close`.
    """

    @torch.inference_mode(False)  # (its buffers: normal tensors also when built under inference mode, see the class)
    def __init__(self, group, max_tokens: int, q_dim: int, k_dim: int, dtype: torch.dtype, *,
                 timeout_s: float = 10.0, _emulation: dict | None = None):
        """See the class docstring (arguments, buffers, errors); ``_emulation`` is :meth:`emulated`'s."""
        self._closed = True  # until construction completes (close() / _run on a half-built object)
        if group is not None and not _is_process_group(group):  # before any collective, which needs it
            raise TypeError(f"group must be a torch.distributed ProcessGroup or None (the default group), "
                            f"got {type(group).__name__}")
        local_error = None
        try:
            if dtype not in DTYPES:
                raise TypeError(_dtype_error(dtype))
            max_tokens = _positive_int("max_tokens", max_tokens, upper=2**31 - 1)  # the kernel's Int32 capacity
            q_dim, k_dim = _positive_int("q_dim", q_dim), _positive_int("k_dim", k_dim)
            self.timeout_ns = _timeout_ns(timeout_s)
        except (TypeError, ValueError) as exc:
            local_error = exc
        if _emulation is None and group is None and local_error is None and not (
                torch.distributed.is_available() and torch.distributed.is_initialized()):
            local_error = ValueError("group=None means the default process group, and none is initialized: call "
                                     "torch.distributed.init_process_group first (ParallelQKNorm.emulated runs G "
                                     "ranks on one GPU without one)")
        elif _emulation is None:  # every rank of a group learns whether all ranks agree, before raising
            _agree_across_ranks(group, (max_tokens, q_dim, k_dim, str(dtype)), local_error)
        if local_error is not None:
            raise local_error
        self.max_tokens, self.q_dim, self.k_dim, self.dtype = max_tokens, q_dim, k_dim, dtype
        self.group = group
        # written by the GPU through its UVA address (pinned host memory), read here without a sync
        self._error = torch.zeros(1, dtype=torch.int32, pin_memory=torch.cuda.is_available())
        self._error_np = self._error.numpy()  # cheap host reads
        self._failed = False
        self._emulated = _emulation is not None
        if _emulation is not None:
            self.rank, self.world = _emulation["rank"], _emulation["world"]
            self.device = _emulation["device"]
            self.fused, self.ranks_per_gpu = True, self.world
            self.buffer = _emulation["buffers"][self.rank]
            self._peer_bufs = _emulation["buffers"]
        else:
            import torch.distributed as dist

            self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
            self.device = (torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available()
                           else torch.device("cpu"))
            self.ranks_per_gpu = 1
            # the shapes are checked before any buffer exchange (after the collective above: every rank has
            # the same arguments, so every rank fails alike)
            self.config = _config_for_world(self.world, q_dim, k_dim, dtype)
            self.fused = 1 < self.world <= MAX_G and self._all_p2p_reachable()
            if self.fused:
                self.buffer, self._peer_bufs = self._exchange_buffers()
        if self._emulated:
            self.config = _config_for_world(self.world, q_dim, k_dim, dtype)
        self.q_width, self.k_width = q_dim // self.world, k_dim // self.world
        if self.fused:
            self.peers = torch.tensor([b.data_ptr() for b in self._peer_bufs], dtype=torch.int64, device=self.device)
            self.state = torch.zeros(_STATE_WORDS, dtype=torch.int32, device=self.device)
            self._fn = _compile(dtype, self.world, q_dim, k_dim)
            self._resident = resident_ctas(dtype, self.world, q_dim, k_dim, self.ranks_per_gpu, self.device)
        self.handle = next(_handles)
        _instances[self.handle] = self
        self._closed = False

    # --- construction helpers
    @classmethod
    @torch.inference_mode(False)  # (the peers' buffers: normal tensors, as the constructor's)
    def emulated(cls, world: int, max_tokens: int, q_dim: int, k_dim: int, dtype: torch.dtype,
                 device=None, timeout_s: float = 10.0) -> list["ParallelQKNorm"]:
        """G ranks on one GPU: G buffers on ``device`` (default: the current CUDA device); run rank r's calls on
        its own stream.  ``timeout_s``: as the constructor's (default 10.0 s).

        Raises ``RuntimeError`` without CUDA, ``TypeError`` for a non-int ``world``, ``ValueError`` for a
        non-CUDA ``device`` or a world size outside [2, 8], and the constructor's errors for the other
        arguments."""
        if isinstance(world, bool) or not isinstance(world, int):
            raise TypeError(f"world must be an int, got {type(world).__name__} {world!r}")
        if world < 2 or world > MAX_G:
            raise ValueError(f"emulated world size {world} must be in [2, {MAX_G}]")
        # the constructor's argument checks, before anything is allocated
        if dtype not in DTYPES:
            raise TypeError(_dtype_error(dtype))
        max_tokens = _positive_int("max_tokens", max_tokens, upper=2**31 - 1)
        ParallelQKNormConfig.for_shape(world, _positive_int("q_dim", q_dim), _positive_int("k_dim", k_dim), dtype)
        _timeout_ns(timeout_s)
        if not torch.cuda.is_available():
            raise RuntimeError("ParallelQKNorm.emulated needs a CUDA device (none is available to torch here)")
        device = torch.device("cuda") if device is None else torch.device(device)
        if device.type != "cuda":
            raise ValueError(f"ParallelQKNorm.emulated needs a CUDA device, got {device}")
        if device.index is None:  # ("cuda": the current device, by index: calls compare q.device with it)
            device = torch.device("cuda", torch.cuda.current_device())
        bufs = [torch.full((2, max_tokens, world), _sentinel_i64(), dtype=torch.int64, device=device)
                for _ in range(world)]
        return [cls(None, max_tokens, q_dim, k_dim, dtype, timeout_s=timeout_s,
                    _emulation=dict(rank=r, world=world, device=device, buffers=bufs)) for r in range(world)]

    def _all_p2p_reachable(self) -> bool:
        import torch.distributed as dist

        me = (socket.gethostname(), torch.cuda.current_device() if torch.cuda.is_available() else -1)
        everyone = [None] * self.world
        dist.all_gather_object(everyone, me, group=self.group)
        ok = me[1] >= 0 and all(h == me[0] and d >= 0 for h, d in everyone) and all(
            d == me[1] or torch.cuda.can_device_access_peer(me[1], d) for _, d in everyone)
        votes = [None] * self.world
        dist.all_gather_object(votes, ok, group=self.group)
        return all(votes) and os.environ.get("CUTE_KERNELS_QKNORM_UNFUSED", "0") != "1"

    def _exchange_buffers(self):
        import torch.distributed as dist

        shape = (2, self.max_tokens, self.world)
        try:
            import torch.distributed._symmetric_memory as symm_mem

            buf = symm_mem.empty(shape, dtype=torch.int64, device=self.device)
            hdl = symm_mem.rendezvous(buf, self.group if self.group is not None else dist.group.WORLD)
            peers = [hdl.get_buffer(r, shape, torch.int64) for r in range(self.world)]
            self._symm_handle = hdl
        except Exception:  # no symmetric memory backend here: CUDA IPC handles over the group
            from torch.multiprocessing.reductions import reduce_tensor

            buf = torch.empty(shape, dtype=torch.int64, device=self.device)
            handles = [None] * self.world
            dist.all_gather_object(handles, reduce_tensor(buf), group=self.group)
            peers = [buf if r == self.rank else fn(*args) for r, (fn, args) in enumerate(handles)]
        buf.fill_(_sentinel_i64())
        torch.cuda.synchronize()
        dist.barrier(group=self.group)
        return buf, peers

    # --- lifetime
    def close(self) -> None:
        """Free this rank's buffers now (idempotent); later calls raise ``RuntimeError``.

        Waits for this rank's launches on its device; call it on every rank after every rank's
        last call (a peer still in flight pushes into this rank's buffer)."""
        if self._closed:
            return
        self._closed = True
        _instances.pop(self.handle, None)
        if self.fused and torch.cuda.is_available() and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        for name in ("buffer", "_peer_bufs", "peers", "state", "_symm_handle", "_fn"):
            if hasattr(self, name):
                setattr(self, name, None)

    @property
    def closed(self) -> bool:
        """True after :meth:`close` (calls and :meth:`reset` then raise ``RuntimeError``)."""
        return self._closed

    def __enter__(self) -> "ParallelQKNorm":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- copies: one object per rank and process (its buffers were exchanged with every peer)
    def __copy__(self) -> "ParallelQKNorm":
        return self

    def __deepcopy__(self, memo) -> "ParallelQKNorm":
        return self

    def __reduce_ex__(self, protocol):
        raise TypeError("a ParallelQKNorm cannot be pickled: it owns this process's push buffers, exchanged with "
                        "every peer of its group; build one in each process (ParallelQKNorm(group, ...))")

    # --- errors and recovery
    def check_error(self, synchronize: bool = True) -> None:
        """Raise :class:`PeerTimeoutError` if a launch of this rank timed out waiting for a peer.  ``synchronize``
        (default True): wait for this rank's device first, so that launches still running are seen; False reads
        the flag as it stands (no sync).  Works on a closed instance too."""
        if synchronize and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        if self._failed or self._error_np[0]:
            self._failed = True
            raise PeerTimeoutError(
                f"ParallelQKNorm rank {self.rank}/{self.world}: a peer did not deliver its partial sums within "
                f"{self.timeout_ns / 1e9:g} s (a rank skipped a call, or calls with different N); outputs of "
                "that launch are wrong and the buffers are out of step: call reset() on every rank")

    def reset(self) -> None:
        """Rearm buffers, epoch and error flag (after a timeout).  Call on every rank (collective).
        ``RuntimeError`` after :meth:`close`."""
        self._check_open()
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize(self.device)
        if self.fused:
            self.buffer.fill_(_sentinel_i64())
            self.state.zero_()
        self._error.zero_()
        self._failed = False
        if cuda:
            torch.cuda.synchronize(self.device)
        if not self._emulated and self.world > 1:
            import torch.distributed as dist

            dist.barrier(group=self.group)

    # --- calls
    def __call__(self, q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
                 eps: float) -> None:
        """Normalize this rank's shards in place: ``q [N, Q/G]``, ``k [N, K/G]`` with ``N <= max_tokens``,
        the weights ``[Q/G]`` / ``[K/G]`` of this rank, the dtype and rules of :func:`cute_kernels.qk_rmsnorm_`
        (seed 000 math over all ranks' sums).  Every rank must make the same sequence of calls with the same
        N.  Raises ``ValueError`` / ``TypeError`` before any launch, ``RuntimeError`` when closed,
        ``PeerTimeoutError`` when an earlier call timed out (until :meth:`reset`)."""
        self._check_open()
        check_eps(eps)  # before float(): True or "1e-6" must not turn into a number
        parallel_qk_rmsnorm_(q, k, q_weight, k_weight, float(eps), self.handle)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"ParallelQKNorm (rank {getattr(self, 'rank', '?')}) is closed")

    def check_shards(self, q, k, capacity: bool = True) -> None:
        """This instance's rules on the shards (widths, dtype, and with ``capacity`` the token count):
        ``ValueError`` (widths, a q or k that is not 2-D, capacity) / ``TypeError`` (dtype, a q or k that is
        not a tensor).  Also the op's trace-time check (no data needed)."""
        if not isinstance(q, torch.Tensor) or not isinstance(k, torch.Tensor):
            raise TypeError(f"q and k must be torch.Tensors, got {type(q).__name__} and {type(k).__name__}")
        if q.dim() != 2 or k.dim() != 2 or q.shape[1] != self.q_width or k.shape[1] != self.k_width:
            raise ValueError(f"rank shards must be q [N, {self.q_width}] and k [N, {self.k_width}] "
                             f"(Q={self.q_dim}, K={self.k_dim}, G={self.world}), got {list(q.shape)}, {list(k.shape)}")
        if q.dtype != self.dtype:
            raise TypeError(f"q has dtype {q.dtype}; this ParallelQKNorm was built for {self.dtype}")
        if capacity and q.shape[0] > self.max_tokens:
            raise ValueError(f"{q.shape[0]} tokens exceed the push-buffer capacity max_tokens={self.max_tokens}; "
                             "build ParallelQKNorm with a larger max_tokens")

    def check_shards_first(self, q, k) -> None:
        """Before the generic argument checks: the shards' widths and dtype (when q and k are 2-D tensors), so
        that a shard of the wrong width or dtype is named as such, not the weight or the tensor checked
        against it."""
        if isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and q.dim() == k.dim() == 2:
            self.check_shards(q, k, capacity=False)

    def _run(self, q, k, q_weight, k_weight, eps) -> None:
        self._check_open()
        if fast_path_key(q, k, q_weight, k_weight, eps) is None:
            self.check_shards_first(q, k)
            validate_qk_args(q, k, q_weight, k_weight, eps, one_gpu_tiling=False)  # (widths: check_shards)
        self.check_shards(q, k)
        n = q.shape[0]
        if self._failed or self._error_np[0]:
            self.check_error(synchronize=False)
        check_no_grad(q, k, q_weight, k_weight)
        if n == 0:
            return
        if not self.fused:
            if self.world == 1:
                from .qknorm import qk_rmsnorm_

                qk_rmsnorm_(q, k, q_weight, k_weight, eps)
            else:
                self._run_unfused(q, k, q_weight, k_weight, eps)
            return
        if q.device != self.device:
            raise ValueError(f"q is on {q.device}; this ParallelQKNorm lives on {self.device}")
        num_ctas = min(-(-n // self.config.norm.rows), self._resident)
        self._fn(launch_view(q), launch_view(k), q_weight, k_weight, self.peers, self.state,
                 self._error.data_ptr(), self.rank, self.max_tokens, num_ctas, eps, self.timeout_ns)
        bump_versions(q, k)

    def _run_unfused(self, q, k, q_weight, k_weight, eps) -> None:
        """Any number of nodes: per-token partial sums, all_reduce, scale (torch ops)."""
        import torch.distributed as dist

        sums = torch.stack([q.float().square().sum(-1), k.float().square().sum(-1)])
        if self.world > 1:
            dist.all_reduce(sums, group=self.group)
        _scale_in_place(q, k, q_weight, k_weight, eps, sums, self.q_dim, self.k_dim)


def _is_process_group(group) -> bool:
    try:
        import torch.distributed as dist

        return isinstance(group, dist.ProcessGroup)
    except (ImportError, AttributeError):  # a torch without distributed: no group can be valid
        return False


def _agree_across_ranks(group, args: tuple, local_error: Exception | None) -> None:
    """Collective (when torch.distributed runs with more than one rank in ``group``): every rank shares
    its constructor arguments (max_tokens, q_dim, k_dim, dtype) and whether its own checks passed, so
    that every rank raises, instead of some waiting forever in the next collective or the ranks
    normalizing with different sizes.  ``ValueError`` if a peer's checks failed or the arguments
    differ; a rank whose own checks failed raises its own error afterwards."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return
    mine = (args, None if local_error is None else f"{type(local_error).__name__}: {local_error}")
    everyone = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, mine, group=group)
    if local_error is not None:
        return
    for r, (_, err) in enumerate(everyone):
        if err is not None:
            raise ValueError(f"ParallelQKNorm: rank {r} refused its arguments ({err}); every rank must be "
                             "built with the same valid arguments")
    for r, (theirs, _) in enumerate(everyone):
        if theirs != args:
            names = ("max_tokens", "q_dim", "k_dim", "dtype")
            raise ValueError(f"ParallelQKNorm arguments differ across ranks: rank {r} has "
                             f"{dict(zip(names, theirs))}, this rank {dict(zip(names, args))}")


def _config_for_world(world: int, q_dim: int, k_dim: int, dtype: torch.dtype) -> "ParallelQKNormConfig | None":
    """The fused kernel's config for up to ``MAX_G`` ranks; beyond that (the unfused path only) just the
    shape rules: Q and K divisible by G, per-rank widths whole 16-byte vectors (``ValueError``).  One rank
    runs the one-GPU op (:func:`.qknorm.qk_rmsnorm_`): its kernel's tiling must take the widths too."""
    if world == 1:  # (no fused config: the one-GPU op runs)
        QKNormConfig.for_shape(q_dim, k_dim, dtype, tuning=DEFAULT_TUNING)
        return None
    if world <= MAX_G:
        return ParallelQKNormConfig.for_shape(world, q_dim, k_dim, dtype)
    vec = vec_elems(dtype)
    if q_dim % world or k_dim % world:
        raise ValueError(f"q_dim={q_dim} and k_dim={k_dim} must be divisible by the world size {world}")
    if (q_dim // world) % vec or (k_dim // world) % vec:
        raise ValueError(f"per-rank widths {q_dim // world} and {k_dim // world} must be multiples of {vec} "
                         f"elements (16-byte vectors)")
    return None


def _sentinel_i64() -> int:
    return SENTINEL - (1 << 64)  # the same 64 bits as a signed int64


def _scale_in_place(q, k, q_weight, k_weight, eps, sums, q_dim, k_dim) -> None:
    q.copy_((q.float() * torch.rsqrt(sums[0] / q_dim + eps)[:, None] * q_weight.float()).to(q.dtype))
    k.copy_((k.float() * torch.rsqrt(sums[1] / k_dim + eps)[:, None] * k_weight.float()).to(k.dtype))


def _fake_parallel_qk_rmsnorm_(q, k, q_weight, k_weight, eps, handle) -> None:
    """Trace-time check (torch.compile / make_fx): the argument rules that need no data pointer, and the
    instance's own (widths, dtype, capacity), as the one-GPU op's fake does; a closed or freed handle is the
    op's RuntimeError at trace time too.  A handle that torch.compile made symbolic (a compiled function called
    with a second instance as an argument) is specialized here (a guard on its value: one graph per instance;
    an instance held as a module attribute is a constant already)."""
    inst = _instance(int(handle))
    inst.check_shards_first(q, k)
    validate_qk_shapes(q, k, q_weight, k_weight, eps, cuda=False, one_gpu_tiling=False)  # (this kernel's tiling:
    inst.check_shards(q, k)  # checked at construction for the widths check_shards holds the shards to)


def _instance(handle) -> "ParallelQKNorm":
    """The live :class:`ParallelQKNorm` that ``handle`` names (``RuntimeError`` once it was closed or freed)."""
    inst = _instances.get(handle)
    if inst is None:
        raise RuntimeError(f"ParallelQKNorm handle {handle} names no live instance of this process: it was closed "
                           "or freed (keep the object alive while code that calls it, e.g. a compiled graph, may "
                           "run), or it was recorded in another process (a saved torch.export program holds the "
                           "handle of the instance it was exported with: export it in the process that runs it)")
    return inst


@custom_op("parallel_qk_rmsnorm_", mutates_args=("q", "k"), fake=_fake_parallel_qk_rmsnorm_)
def parallel_qk_rmsnorm_(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
                         eps: float, handle: int) -> None:
    """The op behind ``ParallelQKNorm.__call__`` (``handle`` names the instance)."""
    _instance(handle)._run(q, k, q_weight, k_weight, eps)


def unfused_emulated_step(ranks: list[ParallelQKNorm], qs, ks, wqs, wks, eps: float) -> None:
    """The unfused baseline through the emulation: sums per rank, summed as an all_reduce would, scale."""
    sums = torch.stack([torch.stack([q.float().square().sum(-1), k.float().square().sum(-1)])
                        for q, k in zip(qs, ks)]).sum(0)
    r0 = ranks[0]
    for q, k, wq, wk in zip(qs, ks, wqs, wks):
        _scale_in_place(q, k, wq, wk, eps, sums, r0.q_dim, r0.k_dim)


def emulated_step(ranks: list[ParallelQKNorm], streams, qs, ks, wqs, wks, eps: float) -> None:
    """One call on every emulated rank, rank r on ``streams[r]`` (forked from and joined to the current stream)."""
    main = torch.cuda.current_stream()
    for r, rank in enumerate(ranks):
        streams[r].wait_stream(main)
        with torch.cuda.stream(streams[r]):
            rank(qs[r], ks[r], wqs[r], wks[r], eps)
    for s in streams:
        main.wait_stream(s)


def parallel_reference(q_full: torch.Tensor, k_full: torch.Tensor, wq_full: torch.Tensor, wk_full: torch.Tensor,
                       eps: float, world: int):
    """float64 reference over the gathered shards: list of (q_shard_out, k_shard_out) per rank.

    ``q_full [N, Q]``, ``k_full [N, K]`` (any float dtype, one device), ``wq_full [Q]``, ``wk_full [K]``;
    rank ``r`` holds columns ``[r*Q/world, (r+1)*Q/world)`` of q (k alike).  Raises ``TypeError`` unless
    ``world`` is an int (not a bool) and the four arguments tensors, ``ValueError`` unless ``world >= 1`` divides Q
    and K (as :class:`ParallelQKNorm` requires of its shards) and the weights are ``[Q]`` and ``[K]`` (no
    broadcasting, no ignored elements)."""
    if type(world) is not int:
        raise TypeError(f"world must be an int >= 1, got {type(world).__name__} {world!r}")
    if world < 1:
        raise ValueError(f"world must be an int >= 1, got {world!r}")
    for name, t in (("q_full", q_full), ("k_full", k_full), ("wq_full", wq_full), ("wk_full", wk_full)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if q_full.dim() != 2 or k_full.dim() != 2 or q_full.shape[1] % world or k_full.shape[1] % world:
        raise ValueError(f"q_full [N, Q] and k_full [N, K] with Q and K multiples of world={world}, got "
                         f"{list(q_full.shape)} and {list(k_full.shape)}")
    for name, w, width in (("wq_full", wq_full, q_full.shape[1]), ("wk_full", wk_full, k_full.shape[1])):
        if tuple(w.shape) != (width,):
            raise ValueError(f"{name} must be [{width}] (the full row's weight), got {list(w.shape)}")
    ssq = q_full.double().square().sum(-1)
    ssk = k_full.double().square().sum(-1)
    qw, kw = q_full.shape[1] // world, k_full.shape[1] // world
    out = []
    for r in range(world):
        sq, sk = slice(r * qw, (r + 1) * qw), slice(r * kw, (r + 1) * kw)
        out.append(qk_rmsnorm_reference(q_full[:, sq], k_full[:, sk], wq_full[sq], wk_full[sk], eps,
                                        q_dim=q_full.shape[1], k_dim=k_full.shape[1], q_sumsq=ssq, k_sumsq=ssk))
    return out


def emulation_stress(world: int, launches: int, max_tokens: int = 4096, q_dim: int = 4096, k_dim: int = 1024,
                     dtype: torch.dtype = torch.bfloat16, seed: int = 0, timeout_s: float = 5.0,
                     join_each_launch: bool = False) -> dict:
    """``launches`` consecutive calls of G emulated ranks, N random in [1, max_tokens], each rank on its own
    stream and (unless ``join_each_launch``) never joined to the others between calls, so ranks run out of
    step; every call is compared with the float64 reference on the GPU (max abs error accumulated there).

    Lazy module loading (CUDA's default) may synchronize the context when a kernel is first launched;
    doing that while a rank spins for a peer whose launch is not yet enqueued would stall until the
    timeout.  So a warm-up pass loads every kernel first, and each iteration enqueues all ranks' norm
    launches before any rank's checking kernels.

    Returns dict(world, launches, max_err, max_n).  Raises PeerTimeoutError (with the launch index).
    """
    torch.manual_seed(seed)
    dev = torch.device("cuda", torch.cuda.current_device())
    ranks = ParallelQKNorm.emulated(world, max_tokens, q_dim, k_dim, dtype, timeout_s=timeout_s)
    qf = torch.randn(max_tokens, q_dim, device=dev).to(dtype)
    kf = torch.randn(max_tokens, k_dim, device=dev).to(dtype)
    qf[3].zero_()  # zero rows (a zero partial from every rank): eps > 0 keeps the result 0
    kf[5].zero_()
    wq = torch.randn(q_dim, device=dev).to(dtype)
    wk = torch.randn(k_dim, device=dev).to(dtype)
    ref = parallel_reference(qf, kf, wq, wk, 1e-6, world)
    qw, kw = q_dim // world, k_dim // world
    src_q = [qf[:, r * qw:(r + 1) * qw].contiguous() for r in range(world)]
    src_k = [kf[:, r * kw:(r + 1) * kw].contiguous() for r in range(world)]
    ws = [(wq[r * qw:(r + 1) * qw].contiguous(), wk[r * kw:(r + 1) * kw].contiguous()) for r in range(world)]
    work_q = [torch.empty_like(t) for t in src_q]
    work_k = [torch.empty_like(t) for t in src_k]
    errs = [torch.zeros((), device=dev) for _ in range(world)]
    streams = [torch.cuda.Stream() for _ in range(world)]
    gen = torch.Generator().manual_seed(seed)
    ns = [int(x) for x in torch.randint(1, max_tokens + 1, (launches,), generator=gen)]
    ns[:4] = [1, max_tokens, 1, max_tokens]

    def one_launch(n: int) -> None:
        for r in range(world):
            with torch.cuda.stream(streams[r]):
                work_q[r][:n].copy_(src_q[r][:n])
                work_k[r][:n].copy_(src_k[r][:n])
                ranks[r](work_q[r][:n], work_k[r][:n], ws[r][0], ws[r][1], 1e-6)
        for r in range(world):
            with torch.cuda.stream(streams[r]):
                e = torch.maximum((work_q[r][:n].float() - ref[r][0][:n].float()).abs().amax(),
                                  (work_k[r][:n].float() - ref[r][1][:n].float()).abs().amax())
                torch.maximum(errs[r], e, out=errs[r])
        if join_each_launch:
            for st in streams:
                torch.cuda.current_stream().wait_stream(st)
                st.wait_stream(torch.cuda.current_stream())

    for n in (1, 7, max_tokens):  # warm-up: load every kernel while nothing spins
        one_launch(n)
        torch.cuda.synchronize()
    for i, n in enumerate(ns):
        one_launch(n)
        if any(r._error_np[0] for r in ranks):
            raise PeerTimeoutError(f"emulated G={world}: a wait timed out, seen at launch {i} of {launches}")
    torch.cuda.synchronize()
    for rank in ranks:
        rank.check_error()
    return dict(world=world, launches=launches, max_err=max(float(e) for e in errs), max_n=max(ns))


def check() -> list[CheckResult]:
    rows = []
    for world in SHIPPED_G:
        out = emulation_stress(world, 50, max_tokens=2048)
        tol = 0.08  # bf16 outputs of |x| up to ~20: one rounding step
        rows.append(CheckResult(NAME, f"emulated G={world} bf16 Q=4096 K=1024, 50 launches N<=2048",
                                out["max_err"] <= tol, out["max_err"], float("nan"), tol))  # (no relative figure)
    return rows


def bench_shapes(shapes: str | None) -> None:
    """:func:`bench` takes no ``shapes`` spec: ``ValueError`` unless it is None."""
    from ..registry import no_spec

    no_spec(NAME, shapes, 'G = 2, 4, 8 emulated on one GPU')


# Emulated ranks inside ONE CUDA graph need the graph's G branches to run concurrently, which CUDA does
# not promise: G = 8 timed out in every graph replay once G = 2 and 4 had been benchmarked in the same
# process (and passed alone); G = 2, 4 and every eager G ran (H200, session 17,
# bench/results/logs/2026-11-30_s17_qknorm_tp_bench_g8_graph.log).  Real ranks each capture their own graph
# on their own GPU, which this does not concern.
GRAPH_MAX_EMULATED_G = 4


def bench(shapes: str | None = None) -> list[dict]:
    """Emulated G ranks on one GPU: fused push-buffer kernel vs the unfused path, per call (CUDA graph and
    eager; the fused kernel in a graph for G <= :data:`GRAPH_MAX_EMULATED_G` only), each after
    :data:`~cute_kernels.runtime.timing.SETTLE_S` seconds of calls.  A peer timeout is recorded as that record's
    ``error`` (the ranks are reset) instead of ending the bench."""
    bench_shapes(shapes)
    from ..runtime.timing import SETTLE_S, cuda_time_us

    recs = []
    q_dim, k_dim, dtype = 4096, 1024, torch.bfloat16
    for world in (2, 4, 8):
        ranks = ParallelQKNorm.emulated(world, 8192, q_dim, k_dim, dtype, timeout_s=3.0)
        streams = [torch.cuda.Stream() for _ in range(world)]
        for n in (1, 8, 64, 512, 4096, 8192):
            qs = [torch.randn(n, q_dim // world, device="cuda", dtype=dtype) for _ in range(world)]
            ks = [torch.randn(n, k_dim // world, device="cuda", dtype=dtype) for _ in range(world)]
            wqs = [torch.ones(q_dim // world, device="cuda", dtype=dtype) for _ in range(world)]
            wks = [torch.ones(k_dim // world, device="cuda", dtype=dtype) for _ in range(world)]
            impls = (("cute_kernels_fused", lambda: emulated_step(ranks, streams, qs, ks, wqs, wks, 1e-6)),
                     ("torch_unfused", lambda: unfused_emulated_step(ranks, qs, ks, wqs, wks, 1e-6)))
            for impl, fn in impls:
                for graph in (True, False):
                    if graph and impl == "cute_kernels_fused" and world > GRAPH_MAX_EMULATED_G:
                        continue
                    rec = dict(kernel=NAME, impl=impl, shape=dict(g=world, n=n, q=q_dim, k=k_dim, dtype="bfloat16",
                                                                 emulated=True), mode="graph" if graph else "eager")
                    try:
                        rec.update(time_us=cuda_time_us(fn, graph=graph, settle_s=SETTLE_S), settle_s=SETTLE_S)
                        torch.cuda.synchronize()
                        for r in ranks:
                            r.check_error()
                    except PeerTimeoutError as exc:
                        for key in ("time_us", "settle_s"):
                            rec.pop(key, None)
                        rec["error"] = repr(exc)[:200]
                        for r in ranks:
                            r.reset()
                    recs.append(rec)
    return recs
