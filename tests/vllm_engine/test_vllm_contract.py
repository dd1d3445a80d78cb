"""The stand-in's contract with the installed vLLM: same signatures, same call sites, same span attributes.

The fast unit tests (tests/instrument/test_vllm.py) run against the stand-in; this module holds it
to the installed vLLM: ``make test`` runs it in ``.venv-vllm`` against vLLM's CPU build, and on a
GPU machine ``python -m pytest tests/vllm_engine`` runs it against the CUDA build. Every check names what
our instrumentation relies on, so a failure says which assumption broke.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect

import pytest
import vllm

from nemo_telemetry.instrument import vllm as nv
from tests.instrument import fake_vllm as fake


def _resolve(dotted: str):
    module_name, _, attr_path = dotted.partition(":")
    obj = importlib.import_module(module_name)
    for part in attr_path.split("."):
        obj = getattr(obj, part)
    return obj


def _shape(fn) -> list[tuple[str, str, str]]:
    """(name, kind, default) per parameter; defaults compared as text only when they are literals."""
    out = []
    for p in inspect.signature(fn).parameters.values():
        default = p.default
        literal = default is inspect.Parameter.empty or isinstance(default, (bool, int, float, str, type(None)))
        out.append((p.name, p.kind.name, repr(default) if literal else "<object>"))
    return out


@pytest.mark.parametrize("surface", sorted(fake.SURFACES))
def test_the_stand_in_has_the_exact_signature(surface):
    """Exact for the releases the double matches; other releases differ in parameters we never touch."""
    if vllm.__version__ not in fake.EXACT_SIGNATURE_RELEASES:
        pytest.skip(f"the stand-in matches vLLM {sorted(fake.EXACT_SIGNATURE_RELEASES)}, this is {vllm.__version__}: "
                    "test_the_parameters_we_use_exist checks what our instrumentation needs from it")
    ours, dotted = fake.SURFACES[surface]
    assert _shape(ours) == _shape(_resolve(dotted)), f"{surface}: update tests/instrument/fake_vllm.py"


@pytest.mark.parametrize("surface", sorted(fake.PARAMETERS_WE_USE))
def test_the_parameters_we_use_exist(surface):
    """Any installed release: each parameter instrument_vllm passes exists, in the order we pass it."""
    _, dotted = fake.SURFACES[surface]
    installed = [name for name, _, _ in _shape(_resolve(dotted))]
    used = fake.PARAMETERS_WE_USE[surface]
    missing = [name for name in used if name not in installed]
    assert not missing, f"vLLM {vllm.__version__} {surface} lacks {missing}"
    positions = [installed.index(name) for name in used]
    assert positions == sorted(positions), f"{surface}: parameter order changed in vLLM {vllm.__version__}"
    if surface == "LLM.generate":
        assert installed[1:3] == ["prompts", "sampling_params"], "the generate wrapper passes these positionally"


def test_offline_generate_still_drops_trace_headers():
    """vLLM issue 32177: if LLM.generate ever passes trace_headers, routing becomes unnecessary."""
    from vllm.entrypoints.llm import LLM

    # Where the request loop lives moved between releases (llm.py; entrypoints/offline_utils.py in
    # 0.2x; entrypoints/common/offline.py in 0.33): read every vLLM class LLM is made of.
    source = "".join(inspect.getsource(klass) for klass in LLM.__mro__ if klass.__module__.startswith("vllm."))
    assert "self.llm_engine.add_request(" in source, "instrument_vllm routes headers through llm_engine.add_request"
    assert "trace_headers" not in inspect.getsource(LLM.generate)


def test_the_engine_accepts_trace_headers_so_the_headers_path_is_taken():
    from vllm.v1.engine.llm_engine import LLMEngine

    assert "trace_headers" in inspect.signature(LLMEngine.add_request).parameters


def test_engine_args_have_the_tracing_fields():
    from vllm.engine.arg_utils import EngineArgs

    names = {f.name for f in dataclasses.fields(EngineArgs)}
    assert {"otlp_traces_endpoint", "collect_detailed_traces", "disable_log_stats"} <= names
    assert set(nv.vllm_tracing_engine_args(endpoint="http://127.0.0.1:4318/v1/traces")) == {"otlp_traces_endpoint"}


def test_llm_request_attributes_match_what_the_stand_in_emits():
    from vllm.tracing import SpanAttributes

    vllm_names = {v for k, v in vars(SpanAttributes).items() if k.startswith("GEN_AI_")}
    stand_in = {"gen_ai.request.id", "gen_ai.usage.prompt_tokens", "gen_ai.usage.completion_tokens",
                "gen_ai.request.max_tokens", "gen_ai.request.n", "gen_ai.latency.e2e",
                "gen_ai.latency.time_in_queue"}
    assert stand_in <= vllm_names


def test_metrics_reader_counter_shape():
    from vllm.v1.metrics.reader import Counter

    assert [f.name for f in dataclasses.fields(Counter)] == [f.name for f in dataclasses.fields(fake.Counter)]
    assert type(Counter("vllm:generation_tokens", {}, 1)).__name__ == "Counter"  # what vllm_counter_totals matches
