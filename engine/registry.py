"""A small model registry with timm's surface: ``register_model``, ``create_model``, ``list_models(pattern)``.

Vision models live in timm's own registry; point and capsule models each get one :class:`ModelRegistry`, so all three
follow the same rules: a variant is a function named after the model, registered by decoration; ``create_model``
passes keyword arguments through to it; an unknown name or a keyword the model does not take is a ``ValueError``
that names the choices.
"""

from __future__ import annotations

import fnmatch
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

__all__ = ["ExampleInputs", "ModelRegistry", "create_by_name", "create_with_kwargs", "example_inputs", "find_registry"]


#: ``example_inputs(model, config)``: a deterministic batch of inputs for ``model`` (the positional arguments of its
#: forward), given the config of the run that trained it (a dict, possibly empty), e.g. its ``num_points``.
ExampleInputs = Callable[[nn.Module, dict[str, Any]], tuple[Tensor, ...]]


class ModelRegistry:
    """Name -> model function, with timm's three functions as methods.

    Args:
        domain: What the models are (for messages), e.g. ``"point cloud"``.
        example_inputs: Builds a deterministic batch of inputs for a model of the registry (:data:`ExampleInputs`):
            what :mod:`engine.export` runs a model on to check that ``--set`` keeps its function.

    Example::

        MODELS, register_model, list_models, create_model = ModelRegistry("point cloud").exports()
    """

    #: Every registry created so far (one per domain package that has been imported), for :func:`find_registry`.
    instances: ClassVar[list[ModelRegistry]] = []

    def __init__(self, domain: str, example_inputs: ExampleInputs | None = None) -> None:
        self.domain = domain
        self.models: dict[str, Callable[..., nn.Module]] = {}
        self.example_inputs = example_inputs
        ModelRegistry.instances.append(self)

    def register_model(self, fn: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        """Decorator: registers ``fn`` under its ``__name__`` (a second registration of a name is an error)."""
        name = fn.__name__
        if name in self.models and self.models[name] is not fn:
            raise ValueError(f"{self.domain} model {name!r} is already registered")
        self.models[name] = fn
        return fn

    def list_models(self, pattern: str = "*") -> list[str]:
        """Sorted registered names matching the shell-style ``pattern`` (e.g. ``"*_routing_*"``)."""
        return sorted(name for name in self.models if fnmatch.fnmatchcase(name, pattern))

    def create_model(self, name: str, checkpoint: str | Path | None = None, **kwargs: Any) -> nn.Module:
        """Builds model ``name``; ``kwargs`` override its defaults (a keyword it does not take is named).

        ``checkpoint``: a ``model.safetensors`` written by ``tools/export_weights.py``, checked
        (:func:`engine.weights.load_weights`: its digest, finite values) and loaded strictly (build with the same
        ``kwargs`` as the exported model: its ``config.json`` lists them under ``model_args``).
        """
        if name not in self.models:
            raise ValueError(f"unknown model {name!r}; the {self.domain} models are {self.list_models()}")
        model = create_with_kwargs(self.models[name], name, kwargs)
        if checkpoint is not None:
            from engine.weights import load_weights

            path = Path(checkpoint)
            if path.suffix != ".safetensors" or not path.is_file():
                raise ValueError(
                    f"checkpoint must be an existing .safetensors file (tools/export_weights.py writes one), got {path}"
                )
            model.load_state_dict(load_weights(path))
        return model

    def exports(
        self,
    ) -> tuple[dict[str, Callable[..., nn.Module]], Callable, Callable[..., list[str]], Callable[..., nn.Module]]:
        """``(models, register_model, list_models, create_model)``: the names a domain's model module exports.

        Example::

            MODELS, register_model, list_models, create_model = ModelRegistry("point cloud").exports()
        """
        return self.models, self.register_model, self.list_models, self.create_model

    def __contains__(self, name: object) -> bool:
        return name in self.models


def create_with_kwargs(factory: Callable[..., nn.Module], name: str, kwargs: dict[str, Any]) -> nn.Module:
    """``factory(**kwargs)``, turning "unexpected keyword argument" into a ``ValueError`` that names the keywords."""
    try:
        return factory(**kwargs)
    except TypeError as err:
        if "unexpected keyword argument" not in str(err):
            raise
        raise ValueError(
            f"model {name!r} does not take one of the keywords {sorted(kwargs)} ({err}); remove it from the config "
            "(set a model knob to null, or drop it from model_kwargs)"
        ) from err


def find_registry(name: str) -> ModelRegistry | None:
    """The :class:`ModelRegistry` that holds model ``name`` (among the domain packages imported so far), or ``None``."""
    return next((registry for registry in ModelRegistry.instances if name in registry), None)


def example_inputs(name: str, model: nn.Module, config: dict[str, Any] | None = None) -> tuple[Tensor, ...]:
    """A deterministic batch of inputs for ``model`` (registered as ``name``): its registry's ``example_inputs``, or
    for a timm model two images of its patch embedding's size (``patch_embed.img_size``, else its pretrained cfg's
    ``input_size``). ``config``: the config of the run that trained it (e.g. its ``num_points``).

    Raises:
        ValueError: the registry of ``name`` builds no example inputs (or ``name`` is in none and not a timm image
            model).
    """
    registry = find_registry(name)
    if registry is not None:
        if registry.example_inputs is None:
            raise ValueError(f"the {registry.domain} registry builds no example inputs for {name!r}")
        return registry.example_inputs(model, dict(config or {}))
    embed = getattr(model, "patch_embed", None)
    size = getattr(embed, "img_size", None)
    chans = getattr(getattr(embed, "proj", None), "in_channels", None)
    if size is None or chans is None:
        input_size = (getattr(model, "pretrained_cfg", None) or {}).get("input_size")
        if input_size is None:
            raise ValueError(f"no example inputs for {name!r}: neither a registered model nor a timm image model")
        chans, size = input_size[0], input_size[1:]
    height, width = (size, size) if isinstance(size, int) else size
    return (torch.randn(2, chans, height, width, generator=torch.Generator().manual_seed(0)),)


def create_by_name(name: str, kwargs: dict[str, Any]) -> nn.Module:
    """Model ``name`` built with the constructor keywords ``kwargs``: from the registry that holds it (among the domain
    packages imported so far), else from timm's (import ``vision`` to register the DeiT variants).

    This is how the recipes build their models and how :mod:`engine.export` rebuilds one from the ``model_spec`` a
    checkpoint records, so both build the same model from the same ``(name, kwargs)``.

    Raises:
        ValueError: ``name`` is in no imported registry and not a timm model, or the model rejects a keyword.
    """
    registry = find_registry(name)
    if registry is not None:
        return registry.create_model(name, **kwargs)
    import timm

    if timm.is_model(name):
        return create_with_kwargs(functools.partial(timm.create_model, name, pretrained=False), name, kwargs)
    known = "; ".join(f"{r.domain}: {r.list_models()}" for r in ModelRegistry.instances)
    raise ValueError(
        f"unknown model {name!r}: neither a timm model nor a registered one ({known or 'no registry imported'})"
    )
