"""The ranker forward's host path on CPU tensors, for the tests that drive its checks, config choice and
launch plans without a GPU or a compile: one set-up instead of a copy in each of them."""
from cute_kernels import tuning
from cute_kernels.kernels import ranker_fwd as rf


def stand_in_forward(monkeypatch, kernel=None) -> list:
    """Patch :mod:`~cute_kernels.kernels.ranker_fwd` (undone with ``monkeypatch``) so that
    ``ranker_attention`` / ``_ranker_impl`` run on CPU tensors:

    - ``_validate`` with ``cuda=False`` (every check but the CUDA-device rule);
    - fresh per-signature memos (``_VALIDATED``, ``_FNS``, ``_CHOSEN``, ``_PLANS``), the last two registered
      with :mod:`~cute_kernels.tuning` as the real ones are, so that ``tuning.reload()`` clears them;
    - ``warn_if_spills`` silent (nothing was compiled, so there is no compile record) and ``sm_count`` 4;
    - ``_compile(*compile_args)`` returning a stand-in for the compiled function which calls
      ``kernel(launch_args)`` first when given (e.g. the refusals of tvm-ffi's own argument checks) and then
      records ``(compile_args, launch_args)``: ``compile_args[1]`` is the config, ``[5]`` whether it writes
      the LSE; ``launch_args`` are the compiled function's (q, k, v, bounds, out, lse, cu_seqlens, scalars).

    Returns the list of those records, in launch order."""
    launched = []
    full = rf._validate
    monkeypatch.setattr(rf, "_validate", lambda *a, **kw: full(*a, **{**kw, "cuda": False}))
    for name in ("_VALIDATED", "_FNS", "_CHOSEN", "_PLANS"):
        monkeypatch.setattr(rf, name, {})
    monkeypatch.setattr(tuning, "_memos", [*tuning._memos, rf._CHOSEN, rf._PLANS])

    def compile_stand_in(*compile_args):
        def launch(*launch_args):
            if kernel is not None:
                kernel(launch_args)
            launched.append((compile_args, launch_args))
        return launch

    monkeypatch.setattr(rf, "_compile", compile_stand_in)
    monkeypatch.setattr(rf, "warn_if_spills", lambda *a: 0)
    monkeypatch.setattr(rf, "sm_count", lambda device: 4)
    return launched
