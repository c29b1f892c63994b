"""Workload estimators with the KnapFormer reference implementation's API:
time a model on sequences of several lengths and fit the cost model that
knapformer's planner balances with,

    seconds ~= k * (24*l*d^2 + gamma*4*l^2*d)      (l tokens, d = d_token)

by knapformer's calibration fit (knapformer._C.fit_cost_model).
"""

import math
import numbers
import operator
import time

import torch

from knapformer import _C

__all__ = ["WorkloadEstimator", "TheoreticalWorkloadEstimator"]

# Highest length the int32 test lengths (and the planner) hold.
_MAX_LENGTH = 2**31 - 1
_FIT_BUFFERS = ("test_seq_lens", "test_latencies", "k", "gamma")


class WorkloadEstimator(torch.nn.Module):
    """Base of workload estimators: ``benchmark_workload(model)`` measures,
    ``predict_workload(seq_len)`` answers the cost of one sequence."""

    def benchmark_workload(self, model, *args, **kwargs):
        raise NotImplementedError

    def predict_workload(self, seq_len):
        raise NotImplementedError


def _integer_at_least(value, name, least):
    """``value`` as an int (anything with __index__), else ValueError naming it."""
    try:
        number = operator.index(value)
    except TypeError:
        raise ValueError(f"{name}: needs an integer >= {least}, got {value!r}") from None
    if number < least:
        raise ValueError(f"{name}: needs an integer >= {least}, got {number}")
    return number


def _test_lengths(seq_len_test_range, seq_len_test_pow_base, seg_n_bins):
    try:
        lo, hi = (operator.index(v) for v in seq_len_test_range)
    except (TypeError, ValueError):
        raise ValueError(f"seq_len_test_range: needs two integers (lo, hi), got "
                         f"{seq_len_test_range!r}") from None
    if lo < 1 or hi < lo or hi > _MAX_LENGTH:
        raise ValueError(f"seq_len_test_range: needs 1 <= lo <= hi <= {_MAX_LENGTH}, got "
                         f"({lo}, {hi})")
    if seq_len_test_pow_base is not None:
        base = seq_len_test_pow_base
        if isinstance(base, bool) or not isinstance(base, numbers.Real) or not base > 1:
            raise ValueError(f"seq_len_test_pow_base: needs a number > 1 (or None), got {base!r}")
        low, high = math.log(lo, base), math.log(hi, base)
        lengths = [int(base**i) for i in range(math.floor(low), math.ceil(high) + 1)]
        what = "seq_len_test_range and seq_len_test_pow_base"
    else:
        if seg_n_bins is None:
            raise ValueError("seg_n_bins: needed (an integer >= 2) when seq_len_test_pow_base "
                             "is None")
        bins = _integer_at_least(seg_n_bins, "seg_n_bins", 2)
        # numpy.linspace(lo, hi, bins).astype(int32), as the reference has
        # it, without numpy (pip's torch does not need it): i * step + lo in
        # float64, the last one exactly hi, truncated.
        step = (hi - lo) / (bins - 1)
        lengths = [int(i * step + lo) for i in range(bins - 1)] + [hi]
        what = "seq_len_test_range and seg_n_bins"
    if len(lengths) < 2:
        raise ValueError(f"{what}: give {len(lengths)} test length(s) {lengths}; the fit needs "
                         "at least 2")
    return lengths


def _as_1d_float64(values, name):
    try:
        tensor = torch.as_tensor(values).detach()
    except (TypeError, ValueError, RuntimeError) as error:
        raise ValueError(f"{name}: needs a 1-D tensor or sequence of numbers ({error})") from None
    if tensor.dim() != 1 or tensor.is_complex() or tensor.dtype == torch.bool:
        raise ValueError(f"{name}: needs a 1-D tensor of real numbers, got shape "
                         f"{tuple(tensor.shape)} of {tensor.dtype}")
    return tensor.cpu().to(torch.float64)


def _model_device_dtype(model):
    parameters = getattr(model, "parameters", None)
    if callable(parameters):
        first = next(iter(parameters()), None)
        if first is not None:
            # Integer (e.g. quantized) weights: the input stays float32.
            dtype = first.dtype if first.is_floating_point() else torch.float32
            return first.device, dtype
    return torch.device("cpu"), torch.float32


def _cuda_devices(value, found):
    if isinstance(value, torch.Tensor):
        if value.is_cuda:
            found.add(value.device)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _cuda_devices(item, found)
    elif isinstance(value, dict):
        for item in value.values():
            _cuda_devices(item, found)
    return found


# The timer (a test replaces it with a clock its model advances).
_clock = time.perf_counter


def _time_model(model, args, num_warmup, num_repeat, model_device):
    """Mean seconds of ``model(*args)`` over ``num_repeat`` calls after
    ``num_warmup`` untimed ones."""
    devices = _cuda_devices(args, set())
    if model_device.type == "cuda":
        # A model on CUDA fed CPU tensors still runs asynchronously.
        devices.add(model_device)

    def synchronize():
        for device in devices:
            torch.cuda.synchronize(device)

    with torch.no_grad():
        for _ in range(num_warmup):
            model(*args)
        synchronize()
        start = _clock()
        for _ in range(num_repeat):
            model(*args)
        synchronize()
        return (_clock() - start) / num_repeat


def _fit_errors(lengths, seconds, d_model, k, gamma):
    """The error figures of knapformer's calibration fit
    (planner/calibration.h) for given k and gamma."""
    predicted = k * (24.0 * lengths * d_model**2 + gamma * 4.0 * lengths**2 * d_model)
    residual = seconds - predicted
    sse = float(torch.sum(residual**2))
    sst = float(torch.sum((seconds - seconds.mean())**2))
    return {
        "rmse_seconds": math.sqrt(sse / len(seconds)),
        "r_squared": 1.0 - sse / sst if sst > 0 else 1.0,
        "max_relative_error": float(torch.max(torch.abs(residual) / seconds)),
    }


class TheoreticalWorkloadEstimator(WorkloadEstimator):
    """Fits ``seconds ~= k * (24*l*d^2 + gamma*4*l^2*d)`` (d = ``d_token``) to
    the times of a model on single sequences of several lengths, as the
    KnapFormer reference implementation's estimator of the same name does,
    with knapformer's calibration fit (relative least squares: each
    residual divided by its measured time).

    The test lengths, ``seq_len_test_list``, span ``seq_len_test_range``
    (lo, hi): the powers ``int(B**i)`` for i from floor(log_B(lo)) to
    ceil(log_B(hi)) when ``seq_len_test_pow_base`` B is given, else
    ``seg_n_bins`` evenly spaced lengths (numpy.linspace, truncated to
    integers). ``gamma_correction=False`` fits k alone with gamma = 1.

    After ``benchmark_workload``, the buffers ``test_seq_lens``,
    ``test_latencies``, ``k`` and (with gamma correction) ``gamma`` hold the
    data and the fit (CPU float64; lengths int64), ``fit`` its dict (k,
    gamma, samples, rmse_seconds, r_squared, max_relative_error), and
    ``predict_workload(l)`` the predicted seconds of a sequence of l tokens.
    The fitted gamma is the balancer's: ``knapformer.SequenceBalancer(
    bag_specs, gamma=estimator.gamma.item())``.
    """

    def __init__(self, seq_len_test_range=(448, 65536), seq_len_test_pow_base=None,
                 seg_n_bins=10, d_token=4096, gamma_correction=True):
        super().__init__()
        d_token = _integer_at_least(d_token, "d_token", 1)
        self.gamma_correction = bool(gamma_correction)
        self.d_token = d_token
        self.seq_len_test_list = _test_lengths(seq_len_test_range, seq_len_test_pow_base,
                                               seg_n_bins)
        self.fit = None
        # Declared empty, so that predict_workload can tell "not benchmarked"
        # and load_state_dict can fill a fresh estimator.
        for name in self._buffer_names():
            self.register_buffer(name, None)

    def _buffer_names(self):
        return _FIT_BUFFERS if self.gamma_correction else _FIT_BUFFERS[:3]

    def benchmark_workload(self, model, d_head=None, test_latencies=None, test_seq_lens=None, *,
                           inputs=None, num_warmup=5, num_repeat=5):
        """Times ``model`` on one sequence of each length of
        ``seq_len_test_list`` (``num_warmup`` untimed calls, then the mean of
        ``num_repeat`` timed ones, under torch.no_grad(), synchronizing CUDA
        around the timing), or takes ``test_latencies`` (seconds) and
        ``test_seq_lens`` given together instead, then fits k (and gamma).

        By default the model is called as ``model(x)`` with ``x =
        torch.randn(l, d_token)`` on the device and dtype of its first
        parameter (CPU float32 without one); ``inputs(l)`` -> tuple of
        arguments replaces that (called once per length, its arguments
        reused for every call; a value other than a tuple is the one
        argument). ``d_head`` is accepted for the reference's signature;
        the default inputs do not need it.

        Raises ValueError on bad arguments or data, and the fit's
        ValueError/RuntimeError when the times do not fit the model (e.g.
        gamma < 0). Returns self.
        """
        for name, value, least in (("num_warmup", num_warmup, 0), ("num_repeat", num_repeat, 1)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
                raise ValueError(f"{name}: needs an integer >= {least}, got {value!r}")
        if inputs is not None and not callable(inputs):
            raise ValueError(f"inputs: needs a function of the sequence length returning the "
                             f"model's arguments, got {type(inputs).__name__}")
        if (test_latencies is None) != (test_seq_lens is None):
            raise ValueError("test_latencies and test_seq_lens: give both (measured seconds and "
                             "their sequence lengths) or neither")
        if test_latencies is None:
            lengths, seconds = self._benchmark(model, inputs, num_warmup, num_repeat)
        else:
            seconds = _as_1d_float64(test_latencies, "test_latencies")
            lengths = _as_1d_float64(test_seq_lens, "test_seq_lens")
            if seconds.numel() != lengths.numel():
                raise ValueError(f"test_latencies and test_seq_lens: need the same length, got "
                                 f"{seconds.numel()} latencies for {lengths.numel()} lengths")
        self._fit(lengths, seconds)
        return self

    def _benchmark(self, model, inputs, num_warmup, num_repeat):
        if self.gamma_correction and len(set(self.seq_len_test_list)) < 2:
            # Caught before the timing: one distinct length cannot separate
            # the linear and attention terms.
            raise ValueError(f"seq_len_test_range: gives one distinct test length "
                             f"{self.seq_len_test_list[0]}; fitting gamma needs at least two")
        device, dtype = _model_device_dtype(model)
        seconds = []
        for seq_len in self.seq_len_test_list:
            if inputs is None:
                args = (torch.randn(seq_len, self.d_token, device=device, dtype=dtype),)
            else:
                args = inputs(seq_len)
                if not isinstance(args, tuple):
                    args = (args,)
            seconds.append(_time_model(model, args, num_warmup, num_repeat, device))
        return (torch.tensor(self.seq_len_test_list, dtype=torch.float64),
                torch.tensor(seconds, dtype=torch.float64))

    def _fit(self, lengths, seconds):
        if lengths.numel() < 2:
            raise ValueError(f"test_seq_lens: {lengths.numel()} test length(s); the fit needs "
                             "at least 2")
        if not bool(torch.all(torch.isfinite(lengths))) or bool(torch.any(lengths < 1)) or \
                bool(torch.any(lengths != torch.round(lengths))):
            raise ValueError(f"test_seq_lens: needs integers >= 1, got {lengths.tolist()}")
        if not bool(torch.all(torch.isfinite(seconds))) or bool(torch.any(seconds <= 0)):
            raise ValueError(f"test_latencies: needs finite times > 0 (seconds), got "
                             f"{seconds.tolist()}")
        int_lengths = [int(v) for v in lengths.tolist()]
        if self.gamma_correction:
            fit = dict(_C.fit_cost_model(int_lengths, seconds.tolist(), self.d_token))
        else:
            # Relative least squares with gamma fixed at 1: minimizes
            # sum((k*w_i - t_i) / t_i)^2, as the two-term fit does.
            l, t = lengths, seconds
            w = 24.0 * l * self.d_token**2 + 4.0 * l**2 * self.d_token
            k = float(torch.sum(w / t) / torch.sum((w / t)**2))
            fit = {"k": k, "gamma": 1.0, "samples": len(int_lengths)}
            fit.update(_fit_errors(l, t, self.d_token, k, 1.0))
        self.fit = fit
        self.register_buffer("test_seq_lens", torch.tensor(int_lengths, dtype=torch.int64))
        self.register_buffer("test_latencies", seconds.clone())
        self.register_buffer("k", torch.tensor(fit["k"], dtype=torch.float64))
        if self.gamma_correction:
            self.register_buffer("gamma", torch.tensor(fit["gamma"], dtype=torch.float64))

    def predict_workload(self, seq_len):
        """Predicted seconds of one sequence of ``seq_len`` tokens:
        k * (24*l*d^2 + gamma*4*l^2*d), with gamma = 1 without correction."""
        if self.k is None:
            raise RuntimeError("predict_workload: no fit yet; call benchmark_workload first")
        gamma = self.gamma.item() if self.gamma_correction else 1.0
        l, d = float(seq_len), float(self.d_token)
        return self.k.item() * (24.0 * l * d * d + gamma * 4.0 * l * l * d)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # A fresh estimator's buffers are None, which load_state_dict would
        # skip (and then call the saved ones unexpected): give them shapes.
        for name in self._buffer_names():
            saved = state_dict.get(prefix + name)
            if saved is not None and self._buffers.get(name) is None:
                self._buffers[name] = torch.empty_like(saved, device="cpu")
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
