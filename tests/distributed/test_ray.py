"""One prioritized per-env buffer in a Ray actor, written by two actors while a learner samples.

Measures: no transition lost, none duplicated, no torn row (every field of every
stored and sampled row agrees with its tag), kwargs (``env_ids``) reaching the
hosted buffer, and priorities written back by the learner steering the very
next sample. Also builds a factory of every torchrl_ext component in a Ray worker.
"""
from __future__ import annotations

import functools
import time

import pytest
import torch

ray = pytest.importorskip("ray")
cloudpickle = pytest.importorskip("cloudpickle")

from omegaconf import OmegaConf  # noqa: E402

import tests.distributed._workers as workers  # noqa: E402
from tests.distributed._workers import torn_rows  # noqa: E402
from tests.distributed.test_factories import COMPONENT_GROUPS, build_all  # noqa: E402
from torchrl_ext.distributed import RayBuffer, buffer_factory, ray_replay_buffer  # noqa: E402
from torchrl_ext.presets import alf_replay_buffer  # noqa: E402

pytestmark = pytest.mark.slow

STEPS_PER_WRITER = 5_000
WRITERS = {0: [0, 1], 1: [2, 3]}  # writer -> the envs it owns
TAG_BASE = 1_000_000  # writer k's tags are k * TAG_BASE + (0 ... STEPS_PER_WRITER - 1)


@pytest.fixture(scope="module")
def local_ray():
    # The test helpers travel by value: Ray workers need not import the tests package.
    cloudpickle.register_pickle_by_value(workers)
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    if started:
        ray.shutdown()


def test_two_writer_actors_lose_nothing_and_priorities_steer_the_next_sample(local_ray) -> None:
    torch.set_num_threads(1)
    per_env = STEPS_PER_WRITER // 2
    # A Hydra config node, as an example's cfg.buffer: built inside the actor.
    node = OmegaConf.create({
        "_target_": "torchrl_ext.presets.alf_replay_buffer", "num_environments": 4,
        "max_length": per_env, "batch_length": 2, "batch_size": 32, "prioritized_sampling": True,
    })
    rb = ray_replay_buffer(node)
    try:
        assert isinstance(rb, RayBuffer)
        write = ray.remote(num_cpus=1)(workers.write_envs)
        refs = [write.remote(rb.client(), envs, k * TAG_BASE, per_env, 50) for k, envs in WRITERS.items()]
        samples = 0
        while len(ray.wait(refs, num_returns=len(refs), timeout=0)[0]) < len(refs):
            if len(rb) < 64:
                time.sleep(0.05)
                continue
            batch = rb.sample()  # concurrent with the writers
            assert batch.shape == (32, 2)
            assert torn_rows(batch) == 0
            # A window is two consecutive steps of one env, so of one writer.
            assert bool((batch["tag"][:, 1] - batch["tag"][:, 0] == 2).all())
            samples += 1
        assert ray.get(refs) == [STEPS_PER_WRITER] * len(WRITERS)

        data, _ = rb.call("gather_all")  # [E, L] in write order
        assert data.shape == (4, per_env) and len(rb) == 2 * STEPS_PER_WRITER
        assert torn_rows(data) == 0
        tags = data["tag"].reshape(-1)
        expected = torch.cat([k * TAG_BASE + torch.arange(STEPS_PER_WRITER) for k in WRITERS])
        assert tags.numel() == tags.unique().numel(), "a transition was stored twice"
        assert torch.equal(tags.sort().values, expected), "a transition was lost"
        for k, envs in WRITERS.items():  # env_ids reached the hosted buffer
            assert bool((data["tag"][envs] // TAG_BASE == k).all())

        # Priority write-back is visible to the next sample.
        batch = rb.sample()
        env, start = batch["env_ids"][0, 0], batch["positions"][0, 0]
        rb.update_window_priority(env.reshape(1), start.reshape(1), 1e12)
        after = rb.sample()
        assert bool((after["env_ids"][:, 0] == env).all() and (after["positions"][:, 0] == start).all())
        # The same through TorchRL's path: update_tensordict_priority on a sample.
        after["td_error"] = torch.zeros(32, 2)
        rb.update_tensordict_priority(after)
        again = rb.sample()
        assert not bool((again["positions"][:, 0] == start).all())
    finally:
        rb.close()


def test_every_component_factory_builds_in_a_ray_worker(local_ray) -> None:
    specs = {name: buffer_factory(cfg) for name, cfg in COMPONENT_GROUPS.items()}
    specs["alf partial"] = functools.partial(alf_replay_buffer, 2, 8, prioritized_sampling=True)
    built = ray.get(ray.remote(num_cpus=1)(build_all).remote(cloudpickle.dumps(specs)))
    assert built == {name: type(factory()).__name__ for name, factory in specs.items()}
