"""SpanRegistry rules from DESIGN.md: namespaces, presets, `all`, case and whitespace, no
subtraction, pending names, strict mode, shared groups, idempotent registration."""

from __future__ import annotations

import logging

import pytest

from nemo_telemetry.errors import RegistryError, SpecError
from nemo_telemetry.instrument import Bucket, SpanRegistry, group


def _registry() -> SpanRegistry:
    reg = SpanRegistry()
    reg.register(
        "trainer",
        [
            group("job", umbrella=True, spans=("t.job",)),
            group("step", umbrella=True, spans=("t.<algo>.step",)),
            group("optimizer", bucket=Bucket.PRODUCTIVE, spans=("t.optimizer",)),
            group("data", bucket=Bucket.OVERHEAD, spans=("t.data.<op>",)),
        ],
        {"default": ["job"], "per_step": ["job", "step", "optimizer", "data"]},
    )
    return reg


def test_preset_and_names_are_unioned():
    reg = _registry()
    assert reg.resolve("default,optimizer") == {"job", "optimizer"}
    assert reg.resolve("per_step") == {"job", "step", "optimizer", "data"}


def test_names_are_case_insensitive_and_whitespace_is_ignored():
    reg = _registry()
    assert reg.resolve("  Default , OPTIMIZER ,, ") == {"job", "optimizer"}
    assert reg.resolve(" per _step ") == reg.resolve("per_step")


def test_all_is_every_registered_group_across_namespaces():
    reg = _registry()
    reg.register("server", [group("http", umbrella=True, spans=("GET",))], {"default": ["http"]})
    assert reg.resolve("all") == {"job", "step", "optimizer", "data", "http"}
    assert reg.resolve("ALL") == reg.resolve("all")


def test_empty_spec_selects_nothing():
    assert _registry().resolve("") == frozenset()
    assert _registry().resolve(None) == frozenset()


def test_unknown_names_are_pending_not_errors():
    enabled, pending = _registry().resolve_with_pending("default,optimzer,megatron_thing")
    assert enabled == {"job"}
    assert pending == {"optimzer", "megatron_thing"}


def test_strict_resolution_lists_valid_options_and_closest_match():
    with pytest.raises(SpecError) as err:
        _registry().resolve("per_stpe", strict=True)
    message = str(err.value)
    assert "did you mean 'per_step'?" in message
    assert "valid options: all, default, per_step, data, job, optimizer, step" in message


def test_subtraction_is_an_error_that_prints_the_explicit_list():
    with pytest.raises(SpecError) as err:
        _registry().resolve("per_step,-job")
    message = str(err.value)
    assert "no subtraction" in message
    assert "data,optimizer,step" in message


def test_reregistration_is_idempotent():
    reg = _registry()
    before = (reg.resolve("all"), reg.presets(), reg.catalogue())
    reg.register(
        "trainer",
        [
            group("job", umbrella=True, spans=("t.job",)),
            group("step", umbrella=True, spans=("t.<algo>.step",)),
            group("optimizer", bucket=Bucket.PRODUCTIVE, spans=("t.optimizer",)),
            group("data", bucket=Bucket.OVERHEAD, spans=("t.data.<op>",)),
        ],
        {"default": ["job"], "per_step": ["job", "step", "optimizer", "data"]},
        allow_override=False,
    )
    assert (reg.resolve("all"), reg.presets(), reg.catalogue()) == before


def test_conflicting_reregistration_without_override_raises():
    reg = _registry()
    with pytest.raises(RegistryError, match="already registered"):
        reg.register("trainer", [group("job", umbrella=True)], {}, allow_override=False)


def test_reregistration_replaces_the_namespace_wholesale():
    reg = _registry()
    reg.register("trainer", [group("job", umbrella=True)], {"default": ["job"]})
    assert reg.resolve("all") == {"job"}
    assert reg.resolve_with_pending("optimizer")[1] == {"optimizer"}


def test_group_registered_by_two_namespaces_is_shared_and_enabled_once():
    reg = _registry()
    reg.register("megatron", [group("optimizer", bucket=Bucket.PRODUCTIVE, spans=("mg.optimizer",))],
                 {"default": ["optimizer"]})
    enabled = reg.resolve("optimizer")
    assert enabled == {"optimizer"}
    (row,) = [r for r in reg.catalogue() if r.name == "optimizer"]
    assert row.namespaces == ("megatron", "trainer")
    assert set(row.spans) == {"t.optimizer", "mg.optimizer"}
    assert "optimizer" in reg.groups_for_span_name("mg.optimizer")
    assert "optimizer" in reg.groups_for_span_name("t.optimizer")


def test_shared_group_with_a_different_bucket_warns(caplog):
    reg = _registry()
    with caplog.at_level(logging.WARNING, logger="nemo_telemetry"):
        reg.register("megatron", [group("optimizer", bucket=Bucket.OVERHEAD)], {})
    assert "registered by 'megatron' and 'trainer'" in caplog.text


def test_presets_are_per_namespace_and_union_without_one():
    reg = _registry()
    reg.register("server", [group("http", umbrella=True)], {"default": ["http"]})
    assert reg.resolve("default", namespace="trainer") == {"job"}
    assert reg.resolve("default", namespace="server") == {"http"}
    assert reg.resolve("default") == {"job", "http"}


def test_preset_naming_an_unknown_group_is_refused():
    with pytest.raises(RegistryError, match="unknown groups"):
        SpanRegistry().register("x", [group("a", umbrella=True)], {"p": ["a", "b"]})


def test_plain_string_groups_are_refused_with_the_fix():
    with pytest.raises(RegistryError, match="declare groups with"):
        SpanRegistry().register("x", ["a"], {})


def test_a_group_declares_bucket_or_umbrella_not_both():
    with pytest.raises(ValueError, match="umbrella group carries no bucket"):
        group("x", umbrella=True, bucket=Bucket.IDLE)
    with pytest.raises(ValueError, match="needs a default bucket"):
        group("x")


def test_span_name_patterns_match_placeholders_only_within_a_segment():
    reg = _registry()
    assert reg.groups_for_span_name("t.grpo.step") == {"step"}
    assert reg.groups_for_span_name("t.grpo.x.step") == frozenset()
    assert reg.groups_for_span_name("t.data.put") == {"data"}
