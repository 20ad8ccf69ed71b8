"""Pick a launcher by backend name: the one place that knows every backend."""

from __future__ import annotations

from training_platform.errors import SpecError
from training_platform.launch.base import Launcher


def launcher_for(backend: str, *, slurm_conf: str | None = None, k8s_images: list[str] | None = None) -> Launcher:
    """A launcher for `local`, `slurm` or `k8s`; optional settings reach the backend's config."""
    if backend == "local":
        from training_platform.launch.local import LocalLauncher

        return LocalLauncher()
    if backend == "slurm":
        from training_platform.launch.slurm import SlurmConfig, SlurmLauncher

        return SlurmLauncher(SlurmConfig(slurm_conf=slurm_conf) if slurm_conf else None)
    if backend == "k8s":
        from training_platform.launch.k8s_manifests import KubernetesConfig
        from training_platform.launch.kubernetes import KubernetesLauncher

        return KubernetesLauncher(KubernetesConfig(approved_images=tuple(k8s_images)) if k8s_images else None)
    raise SpecError(f"backend: unknown launcher {backend!r}; use local, slurm or k8s")
