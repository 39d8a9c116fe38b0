"""Engine lookup by name, so stage scripts never switch on the backend."""

from __future__ import annotations

from typing import Callable

from longturn.params.config import Params
from longturn.engines.base import Engine, SamplingParams
from longturn.errors import SettingError


def _hf(model_dir: str, params: Params) -> Engine:
    from longturn.device import resolve_device, resolve_dtype
    from longturn.engines.hf import HFEngine

    e = params.engine
    device = resolve_device(e.device)
    return HFEngine(model_dir, dtype=resolve_dtype(params.model.dtype, device), device=device,
                    batch_size=e.batch_size, cuda_graphs=e.cuda_graphs)


def _sglang(model_dir: str, params: Params) -> Engine:
    from longturn.engines.sglang import make_sglang_engine

    return make_sglang_engine(model_dir, params.engine.sglang)


ENGINES: dict[str, Callable[[str, Params], Engine]] = {"hf": _hf, "sglang": _sglang}


def engine_factory(name: str) -> Callable[[str, Params], Engine]:
    """The factory of `engine.name`; a SettingError naming the choices (checked before any load)."""
    try:
        return ENGINES[name]
    except KeyError:
        raise SettingError(f"engine.name {name!r} is not one of {sorted(ENGINES)}") from None


def make_engine(model_dir: str, params: Params) -> Engine:
    """The engine named by `engine.name`, serving the weights in `model_dir`."""
    return engine_factory(params.engine.name)(model_dir, params)


def sampling_from_params(params: Params, seed: int, temperature: float | None = None) -> SamplingParams:
    """The engine.sampling section as SamplingParams, with a seed and an optional temperature."""
    return SamplingParams.from_config(params.engine.sampling, seed=seed, temperature=temperature)
