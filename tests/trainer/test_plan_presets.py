"""The generation phase of the GPU memory plan (trainer/plan.py): the no-grad forward's two terms by hand, and
every paper preset's engine share is the one the plan derives."""

from pathlib import Path

import pytest

from perf.gpu_plan import plan
from trainer.plan import CARD_BYTES, GB, HEADROOM, SHAPES, UTIL_STEP, generation_terms, scoring_bytes_per_token

REPO = Path(__file__).resolve().parents[2]
PRESETS = sorted(p.stem for p in (REPO / "trainer" / "configs").glob("*.yaml")
                 if "engine: vllm" in p.read_text())


def test_the_no_grad_forward_terms_at_7b_by_hand():
    s = SHAPES["Qwen/Qwen2.5-Math-7B"]
    # residual + normed input 4 x 3584, beside silu(gate), up and their product 6 x 18944 (the attention block's
    # 6 x 3584 + 6 x 512 is smaller)
    assert scoring_bytes_per_token(s) == 4 * 3584 + 6 * 18944 == 128_000
    g = generation_terms(s, tokens=32768)
    assert g["root_gathered"] == pytest.approx(2 * (2 * 152064 * 3584 + 3584) / GB)   # embeddings, head, norm: 2.18
    layer = 2 * 2 * (28 * 3584 * 128 + 2 * 3584 * 4 * 128 + 28 * 128 * 3584 + 3 * 3584 * 18944 + 2 * 3584
                     + 28 * 128 + 2 * 4 * 128) / GB   # the layer gathered and the one prefetched, bf16
    assert g["scoring_at"] == "a decoder layer" and g["scoring"] == pytest.approx(layer + 32768 * 128_000 / GB)
    assert 5.0 < g["scoring"] < 5.2


def test_the_presets_cover_every_backbone_the_plan_knows():
    assert len(PRESETS) >= 21
    assert {plan(p)["model"] for p in PRESETS} == set(SHAPES)


@pytest.mark.parametrize("preset", PRESETS)
def test_each_preset_engine_share_is_the_plans(preset):
    """vllm_gpu_memory_utilization is the largest multiple of UTIL_STEP whose generation phase (state, allowance, the
    no-grad forward's root and transient, the share) leaves HEADROOM of the card: one step more would not. A LoRA
    preset's engine stays awake through the update, so its larger phase is the one held to the headroom."""
    p = plan(preset)
    card = CARD_BYTES / GB
    peak = max(p["generation"], p["update_peak"]) if p["engine_awake_in_update"] else p["generation"]
    assert p["util"] == p["derived_util"], f"{preset}: set vllm_gpu_memory_utilization: {p['derived_util']:g}"
    assert card - peak >= HEADROOM * card
    assert card - (peak + UTIL_STEP * card) < HEADROOM * card
