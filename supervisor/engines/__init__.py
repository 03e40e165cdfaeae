"""The engines the daemon supervises (SGLang, vLLM): one profile each, chosen per rung."""

from __future__ import annotations

from supervisor.engines.profile import ENGINES, Engine, EngineProfile
from supervisor.engines.sglang import SGLANG
from supervisor.engines.vllm import VLLM

PROFILES: dict[Engine, EngineProfile] = {"sglang": SGLANG, "vllm": VLLM}


def profile_of(engine: Engine) -> EngineProfile:
    return PROFILES[engine]


__all__ = ["ENGINES", "PROFILES", "SGLANG", "VLLM", "Engine", "EngineProfile", "profile_of"]
