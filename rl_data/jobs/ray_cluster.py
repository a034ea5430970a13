"""Connect the main job to Ray: the job's cluster, an existing one, or a local one with headroom."""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass
from typing import Optional

from rl_data.jobs.config import RANK_CPUS, TRAINER_CPUS, TrainDemoConfig

#: CPU slots left free for Ray Data read tasks and the driver's own work.
HEADROOM_CPUS = 2


@dataclass(frozen=True)
class ClusterInfo:
    """What the job needs to know about the cluster it runs on."""

    started_here: bool
    cpus: float
    gpus: float
    dashboard_url: Optional[str]


def local_cpus(config: TrainDemoConfig) -> int:
    """CPU slots for a local cluster of the SFT main job (see :func:`local_cpus_for`)."""
    return local_cpus_for(reserved_cpus(config))


def reserved_cpus(config: TrainDemoConfig) -> float:
    """CPU slots the SFT job holds at once: its rank actors and the larger run's training actors."""
    return config.shards * RANK_CPUS + max(config.dp_of_run(1), config.dp_of_run(2)) * TRAINER_CPUS


def local_cpus_for(reserved_cpus: float) -> int:
    """CPU slots for a local cluster: the machine's cores, at least what the job reserves + headroom."""
    return max(os.cpu_count() or 1, math.ceil(reserved_cpus + HEADROOM_CPUS))


def connect(config: TrainDemoConfig) -> ClusterInfo:
    """:func:`connect_to_ray` for the SFT main job (see :func:`reserved_cpus`)."""
    return connect_to_ray(config.namespace, reserved_cpus=reserved_cpus(config))


def connect_to_ray(namespace: str, *, reserved_cpus: float) -> ClusterInfo:
    """Attach when already connected or ``$RAY_ADDRESS`` is set (inside ``ray job submit``);
    otherwise start a private local Ray (``address="local"``) with the machine's cores, at least
    ``reserved_cpus`` + :data:`HEADROOM_CPUS`."""
    import ray

    started = False
    if not ray.is_initialized():
        if os.environ.get("RAY_ADDRESS"):
            ray.init(address="auto", namespace=namespace)
        else:
            ray.init(address="local", num_cpus=local_cpus_for(reserved_cpus), namespace=namespace)
            started = True
    resources = ray.cluster_resources()
    return ClusterInfo(
        started_here=started,
        cpus=float(resources.get("CPU", 0.0)),
        gpus=float(resources.get("GPU", 0.0)),
        dashboard_url=dashboard_url(),
    )


def dashboard_url() -> Optional[str]:
    """``http://host:port`` of the Ray dashboard, or None when it does not run."""
    from ray._private.worker import get_dashboard_url

    url = None
    with contextlib.suppress(Exception):
        url = get_dashboard_url()
    if not url:
        return None
    return url if url.startswith("http") else f"http://{url}"


def trainer_gpus(config: TrainDemoConfig, cluster: ClusterInfo) -> float:
    """``--trainer-gpus``, else one GPU per training actor when the cluster has a GPU for each."""
    if config.trainer_gpus is not None:
        return config.trainer_gpus
    return 1.0 if cluster.gpus >= config.ranks else 0.0
