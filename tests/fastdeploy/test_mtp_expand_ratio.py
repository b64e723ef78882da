"""MTP with ``num_gpu_block_expand_ratio`` 2: the draft's tensor specs as FastDeploy's
backend states them, for ``int(blocks * ratio)`` blocks, are taken, and exactly those shapes are allocated.

FastDeploy (develop c1b7c083): the proposer sets ``self.num_gpu_blocks = int(main_model_num_blocks *
num_gpu_block_expand_ratio)`` and asks its attention backend's ``get_kv_cache_shape(max_num_blocks=...)`` for that
count (``fastdeploy/spec_decode/mtp.py`` ``MTPProposer.initialize_kv_cache``, lines 209 and 224); the runner asks for
the main count (``worker/gpu_model_runner.py`` ``initialize_kv_cache``). MTP adds one cache layer
(``config.py`` ``SpeculativeConfig``: ``num_extra_cache_layer = 1``). The backends' shapes: GQA's append attention
``[blocks, kv_heads, block_size, head_dim]`` for key and value; MLA's ``[blocks, 1, block_size, kv_lora_rank +
qk_rope_head_dim]`` for the key alone (its value is a ``[]`` placeholder, no cache).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import replace

import pytest
from kv_requests import kv_request

from fd_platforms.contract.errors import ConfigError
from fd_platforms.contract.types import CacheRoleShape, DeviceMemory
from fd_platforms.engine import initialize_kv_cache
from fd_platforms.ipc.cache_signal import CacheReadySignal
from fd_platforms.rules.config import CacheConfig, ParallelConfig, load_model_config
from fd_platforms.rules.layout import build_layout
from fd_platforms.rules.planner import plan_blocks

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")
RATIO = 2.0
MIXED = {"profile": False, "num_cpu_blocks": 0, "storage_backend": None, "splitwise_role": "mixed"}


@pytest.fixture
def signal() -> Iterator[CacheReadySignal]:
    with CacheReadySignal.create(1) as owner:
        yield owner


def qwen3():  # type: ignore[no-untyped-def]
    """Qwen3-30B-A3B (GQA: 4 KV heads of 128) with FastDeploy's one MTP cache layer (its config.json has none)."""
    model = load_model_config(os.path.join(EXAMPLES, "qwen3-30b-a3b"))
    return replace(model, num_nextn_predict_layers=1, use_mtp=True)


def deepseek_v3():  # type: ignore[no-untyped-def]
    return load_model_config(os.path.join(EXAMPLES, "deepseek-v3"), use_mtp=True)


def backend_shapes(model, blocks: int) -> tuple[CacheRoleShape, ...]:  # type: ignore[no-untyped-def]
    """What FastDeploy's attention backend states for ``blocks`` blocks (block size 64, bf16, no quantization)."""
    if model.attention == "mla":
        return (CacheRoleShape("key", (blocks, 1, 64, model.kv_lora_rank + model.qk_rope_head_dim), "bfloat16"),)
    shape = (blocks, model.num_key_value_heads, 64, model.head_dim)
    return (CacheRoleShape("key", shape, "bfloat16"), CacheRoleShape("value", shape, "bfloat16"))


@pytest.mark.parametrize("model_of", [qwen3, deepseek_v3], ids=["qwen3-gqa", "deepseek-v3-mla"])
def test_runner_and_proposer_allocate_what_fastdeploys_backend_states_at_ratio_2(cpu, signal, model_of) -> None:
    """The plan's blocks count the draft's doubled blocks; the runner's specs state the plan's count, the proposer's
    ``int(count * 2)`` (refused on b3265ec: "does not start with the block axis"); each allocates exactly those
    shapes, the rank is ready once both are, and the two caches' bytes are the layout's device bytes."""
    model = model_of()
    cache = CacheConfig(block_size=64, num_gpu_block_expand_ratio=RATIO)
    whole = build_layout(model, cache, ParallelConfig())
    per_layer = whole.layer_bytes_per_block
    plan = plan_blocks(whole, DeviceMemory(64 * 2**20, None, None, "test"), cache)
    blocks, draft_blocks = plan.num_blocks, int(plan.num_blocks * RATIO)
    assert plan.num_draft_blocks == draft_blocks
    assert per_layer * (model.num_hidden_layers * blocks + draft_blocks) == whole.device_bytes(blocks)
    runner = initialize_kv_cache(
        cpu, kv_request(whole.main(), blocks, instance=signal.name, **MIXED, tensor_specs=backend_shapes(model, blocks))
    )
    try:
        proposer = initialize_kv_cache(
            cpu,
            kv_request(
                whole.draft(), blocks, instance=signal.name, **MIXED, tensor_specs=backend_shapes(model, draft_blocks)
            ),
        )
        try:
            assert signal.slots() == (1,), "the rank is ready once main and draft are both published"
            stated = [list(spec.shape) for spec in backend_shapes(model, draft_blocks)]
            assert [list(tensor.shape) for tensor in proposer.tensors] == stated
            assert proposer.names[0] == f"key_caches_{model.num_hidden_layers}_rank0.device0"
            main_stated = [list(spec.shape) for spec in backend_shapes(model, blocks)]
            assert [list(tensor.shape) for tensor in runner.tensors] == main_stated * model.num_hidden_layers
            allocated = sum(t.numel().item() * 2 for t in [*runner.tensors, *proposer.tensors])  # bf16: 2 bytes
            assert allocated == whole.device_bytes(blocks)
        finally:
            proposer.clear()
    finally:
        runner.clear()


@pytest.mark.parametrize("model_of", [qwen3, deepseek_v3], ids=["qwen3-gqa", "deepseek-v3-mla"])
def test_draft_specs_at_the_main_block_count_are_refused_naming_the_expanded_count(cpu, signal, model_of) -> None:
    """The draft holds int(blocks * 2) blocks: specs stating the main count would allocate shapes nobody stated."""
    model = model_of()
    whole = build_layout(model, CacheConfig(block_size=64, num_gpu_block_expand_ratio=RATIO), ParallelConfig())
    with pytest.raises(ConfigError) as caught:
        initialize_kv_cache(
            cpu, kv_request(whole.draft(), 5, instance=signal.name, **MIXED, tensor_specs=backend_shapes(model, 5))
        )
    message = str(caught.value)
    assert caught.value.field == "tensor_specs" and "(10 blocks asked)" in message, message
    assert "int(5 * num_gpu_block_expand_ratio 2)" in message, message
    assert signal.slots() == (0,)
