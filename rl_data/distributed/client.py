"""Find a running data coordinator from another driver or an RL training loop."""

from __future__ import annotations

from typing import Any

from rl_data.distributed.config import DEFAULT_NAME, DEFAULT_NAMESPACE


class CoordinatorNotFoundError(LookupError):
    """No coordinator actor with the given name lives in the given namespace."""


def get_coordinator(name: str = DEFAULT_NAME, namespace: str = DEFAULT_NAMESPACE) -> Any:
    """The handle of the named ``DataCoordinator`` (the driver must already be connected to Ray).

    Every call on the handle returns an ObjectRef; ``ray.get`` it with a timeout.
    """
    import ray

    if not ray.is_initialized():
        raise RuntimeError(
            "not connected to Ray: call ray.init(address=..., namespace=...) with the cluster "
            "address before get_coordinator"
        )
    try:
        return ray.get_actor(name, namespace=namespace)
    except ValueError:
        raise CoordinatorNotFoundError(
            f"no data coordinator named {name!r} in Ray namespace {namespace!r}; start one with "
            "rl_data.distributed.start_data_coordinator (RuntimeConfig.name/namespace must "
            "match) and check that its job is still running"
        ) from None
