"""A week of runs stops growing past what retention keeps: ten runs of the example, `tp gc`, restores.

The runs are driven through the worker's own checkpointer (RunCheckpointer: the background writer
process and the spec's retention policy, as a worker saves), with the example's model and optimizer,
not through the platform server (about 25 s a run there). The registry is a real MLflow registry in
the home, and `tp gc` runs as a user runs it.
"""

from __future__ import annotations

import subprocess

import dagster as dg
import pytest
import torch
from mlflow.tracking import MlflowClient

from tests.fixtures.platform import TP, last_json, platform_env
from training_platform.checkpoints import open_store
from training_platform.lifecycle.registry import model_pin_reason
from training_platform.paths import PlatformHome
from training_platform.shipped import DEMO_SPEC
from training_platform.spec import load_spec
from training_platform.train.checkpointing import RunCheckpointer, retention_policy
from training_platform.train.templates import get_template

pytestmark = pytest.mark.integration

RUNS = 10
MODEL = "digits-classifier"


def train_and_save(checkpointer: RunCheckpointer, spec, seed: int, on_saved) -> dict[int, dict]:
    """The example's loop, shortened: Adam steps on random digits-shaped batches, a save every 50 steps."""
    torch.manual_seed(seed)
    model = get_template(spec.model.template).build_model(spec, 64, 10)
    optimizer = torch.optim.Adam(model.parameters(), lr=spec.training.learning_rate)
    saved = {}
    for step in range(1, spec.training.max_steps + 1):
        loss = torch.nn.functional.cross_entropy(model(torch.randn(32, 64)), torch.randint(10, (32,)))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % spec.checkpoint.every_steps == 0:
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
            checkpointer.save(step, state, {"val_loss": loss.item()}, wait=False)
            saved[step] = {name: tensor.clone() for name, tensor in model.state_dict().items()}
            on_saved(step)
    return saved


@pytest.fixture
def home(tmp_path, monkeypatch) -> PlatformHome:
    monkeypatch.setenv("TP_HOME", str(tmp_path / "home"))
    return PlatformHome.from_env().ensure()


def register(client: MlflowClient, store_uri: str, run_key: str, step: int) -> str:
    """A model version whose lineage tag names its checkpoint, pinned as `registered_model` pins it."""
    store = open_store(store_uri)
    manifest = next(m for m in store.list(run_key) if m.step == step)
    version = client.create_model_version(MODEL, source=f"runs:/{run_key}/model", tags={"checkpoint_uri": manifest.uri})
    store.pin(run_key, step, model_pin_reason(MODEL, version.version))
    return version.version


def test_ten_runs_with_keep_last_2_then_gc_keep_only_what_retention_keeps(home):
    spec = load_spec(DEMO_SPEC)
    spec = spec.model_copy(update={"checkpoint": spec.checkpoint.model_copy(update={"keep_last": 2})})
    store_uri = str(home.checkpoints)
    client = MlflowClient(tracking_uri=home.mlflow_tracking_uri)
    client.create_registered_model(MODEL)
    expected: dict[tuple[str, int], dict] = {}
    versions: dict[str, tuple[str, int]] = {}

    for run in range(RUNS):
        run_key = f"digits-{run}"
        checkpointer = RunCheckpointer(
            open_store(store_uri), run_key, retention=retention_policy(spec.checkpoint), background=True,
            on_saved=lambda manifest: None, on_failed=lambda step, error: pytest.fail(f"save {step}: {error}"),
        )

        def on_saved(step: int, run: int = run, run_key: str = run_key, checkpointer=checkpointer) -> None:
            # run 3 registers an early checkpoint, which retention would remove; run 8's version is
            # deleted again before GC, so its pin must go and retention take that checkpoint after all.
            if (run, step) in ((3, 100), (8, 50)):
                checkpointer.flush()
                versions[register(client, store_uri, run_key, step)] = (run_key, step)

        saved = train_and_save(checkpointer, spec, seed=run, on_saved=on_saved)
        checkpointer.close()
        expected |= {(run_key, step): weights for step, weights in saved.items()}
    deleted = next(v for v, where in versions.items() if where == ("digits-8", 50))
    client.delete_model_version(MODEL, deleted)

    store = open_store(store_uri)
    chunk_bytes = lambda: stored_bytes(store)  # noqa: E731
    before = chunk_bytes()
    env = platform_env(home.root)
    dry = last_json(subprocess.run([TP, "gc", "--dry-run", "--grace-hours", "0", "--json"], env=env,
                                   capture_output=True, text=True, timeout=300))
    assert dry["dry_run"] and dry["freed_bytes"] > 0 and chunk_bytes() == before  # nothing deleted

    done = subprocess.run([TP, "gc", "--grace-hours", "0", "--json"], env=env, capture_output=True, text=True,
                          timeout=300)
    report = last_json(done)
    after = chunk_bytes()
    [home_store] = report["stores"]
    assert home_store["pins_removed"] == [["digits-8", 50, model_pin_reason(MODEL, deleted)]]
    assert report["freed_bytes"] == before - after
    # Every run's pruned checkpoints are named in the per-run figures.
    assert {f"digits-{run}" for run in range(RUNS)} <= set(home_store["by_run"])
    assert "digits-8" in done.stderr and "freed" in done.stderr  # the rich table, for people

    kept = {run_key: store.list(run_key) for run_key in (f"digits-{run}" for run in range(RUNS))}
    for run_key, manifests in kept.items():
        steps = [m.step for m in manifests]
        assert steps == ([100, 250, 300] if run_key == "digits-3" else [250, 300]), run_key
    kept_bytes = sum(m.total_bytes for manifests in kept.values() for m in manifests)
    refs = [ref for manifests in kept.values() for m in manifests for ref in m.chunks]
    unique = {ref.digest: ref.size for ref in refs}
    # Nothing but what the kept checkpoints read: the packs they read chunks from (a pack goes whole, so one
    # that also holds a pruned save's chunks keeps them), and their chunks stored on their own.
    packs = {info.key.removeprefix("packs/") for info in store.storage.list_info("packs") if "." not in info.key}
    assert packs == {ref.pack for ref in refs if ref.pack}
    assert {info.key.removeprefix("chunks/") for info in store.storage.list_info("chunks")} <= set(unique)
    assert sum(unique.values()) <= after < before
    print(f"\nten runs, keep_last 2: chunks before GC {before} B, after {after} B, kept checkpoints {kept_bytes} B "
          f"({sum(len(m) for m in kept.values())} checkpoints), dry run would free {dry['freed_bytes']} B")

    for manifests in kept.values():
        for manifest in manifests:
            restored = store.load(manifest)["model"]
            weights = expected[(manifest.run_id, manifest.step)]
            assert all(torch.equal(restored[name], weights[name]) for name in weights), manifest.uri
    for version in client.search_model_versions(f"name='{MODEL}'"):
        run_key, step = versions[version.version]
        manifest = next(m for m in store.list(run_key) if m.step == step)
        assert manifest.uri == version.tags["checkpoint_uri"]
        assert torch.equal(store.load(manifest)["model"]["0.weight"], expected[(run_key, step)]["0.weight"])


def stored_bytes(store) -> int:
    """Bytes of the store's chunks on their own and of its packs (not their indexes)."""
    infos = store.storage.list_info("chunks") + store.storage.list_info("packs")
    return sum(info.size for info in infos if not info.key.endswith(".json"))


def test_the_schedule_runs_the_lifecycle_job_and_the_asset_reports_it(home):
    from assets.lifecycle import checkpoint_lifecycle_job, checkpoint_storage
    from definitions import defs
    from resources.platform import PlatformResource

    schedule = defs.get_schedule_def("checkpoint_lifecycle_schedule")
    assert schedule.job_name == checkpoint_lifecycle_job.name
    assert schedule.default_status == dg.DefaultScheduleStatus.RUNNING

    store = open_store(home.checkpoints)
    store.lease_settle_seconds = 0.5
    for step in (1, 2, 3):
        store.save("r", step, {"w": torch.full((1000,), float(step))})
    store.prune("r", keep_last=1)
    (home.root / "checkpoint-lifecycle.yaml").write_text("grace_hours: 0\n")
    before = stored_bytes(store)
    result = dg.materialize([checkpoint_storage], resources={"platform": PlatformResource(home=str(home.root))})
    metadata = result.asset_materializations_for_node("checkpoint_storage")[0].metadata
    freed = before - stored_bytes(store)
    # Step 2's weights at least (step 1's share a pack with the state's skeleton when one thread wrote both).
    assert freed >= 4000 and metadata["freed_bytes"].value == freed and metadata["freed_chunks"].value >= 1
    assert metadata["stored_bytes_after"].value == stored_bytes(store) > 0
    assert [m.step for m in store.list("r")] == [3] and store.restore_latest("r").manifest.step == 3
