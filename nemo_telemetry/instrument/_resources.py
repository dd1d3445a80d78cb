"""Resource attributes: what every span of a process says about where it came from.

``nemo.run.id`` joins the processes of one run; ``nemo.telemetry.span_groups`` records what this
process was asked to emit, so the analysis can tell "nothing happened" from "nothing was enabled",
and ``nemo.telemetry.namespace`` the namespace it resolved that spec in (whose code it runs).
``rl.fleet`` and ``nv.dl.gpu.count`` say which fleet a process serves and how many GPUs it holds:
per process, never inherited, because a run's fleets differ in both (seed 000, per-fleet accounting).

The run's own description (model, precision, parallel sizes, batch settings) is derived once, in
the driver, from the trainer's whole config (:func:`run_resource_attributes`) and handed to the
workers as JSON in ``NEMO_TELEMETRY_RESOURCE_ATTRIBUTES`` with the rest of the settings. Software
versions are read by every process for itself (a generation worker's venv is not the driver's),
from package metadata: nothing is imported to learn its version.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import socket
import sys
from typing import Any, Iterable, Mapping

from opentelemetry.sdk.resources import Resource

__all__ = [
    "build_resource",
    "run_resource_attributes",
    "software_versions",
    "encode_run_attributes",
    "decode_run_attributes",
    "resolve_gpu_count",
    "fleet_for_role",
    "RUN_ID_KEY",
    "SPAN_GROUPS_KEY",
    "FLEET_KEY",
    "GPU_COUNT_KEY",
    "FLEETS",
    "DRIVER_FLEET",
    "NAMESPACE_KEY",
    "SOFTWARE_PACKAGES",
    "MAX_RUN_ATTRIBUTES_BYTES",
]

_log = logging.getLogger("nemo_telemetry")

RUN_ID_KEY = "nemo.run.id"
SPAN_GROUPS_KEY = "nemo.telemetry.span_groups"
NAMESPACE_KEY = "nemo.telemetry.namespace"
MAX_RUN_ATTRIBUTES_BYTES = 16 * 1024  # an environment variable, copied into every worker
FLEET_KEY = "rl.fleet"
GPU_COUNT_KEY = "nv.dl.gpu.count"
DRIVER_FLEET = "driver"
FLEETS = ("policy", "generation", "value", "reference", "collector", "gym", DRIVER_FLEET)
"""The fleet words the catalogue knows; any other non-empty word is kept as the user wrote it."""

# traced_worker_init's role -> the fleet it serves, where the two words differ (vLLM is generation).
_ROLE_FLEETS = {"vllm": "generation", "sglang": "generation", "generation": "generation"}

SOFTWARE_PACKAGES = {
    "torch": "torch",
    "transformers": "transformers",
    "trl": "trl",
    "accelerate": "accelerate",
    "vllm": "vllm",
    "ray": "ray",
    "opentelemetry_sdk": "opentelemetry-sdk",
    "nemo_telemetry": "nemo-telemetry",
}
"""``nv.dl.software.<key>`` -> the distribution whose installed version it reports (plus ``python``)."""

# Campaign stage by algorithm: supervised fine-tuning and reward-model training are not RL.
_STAGES = {"sft": "SFT", "sft_v2": "SFT", "rm": "RM"}

# (attribute, path in the trainer's config); "{algo}" is the algorithm's own section (grpo, sft, ...).
_TRAINING_SETTINGS = (
    ("nv.dl.training.config.global_batch_size", "policy.train_global_batch_size"),
    ("nv.dl.training.config.micro_batch_size", "policy.train_micro_batch_size"),
    ("nv.dl.training.config.max_sequence_length", "policy.max_total_sequence_length"),
    ("nv.dl.training.config.num_prompts_per_step", "{algo}.num_prompts_per_step"),
    ("nv.dl.training.config.num_generations_per_prompt", "{algo}.num_generations_per_prompt"),
    ("nv.dl.training.config.seed", "{algo}.seed"),
    ("nv.dl.training.target.max_steps", "{algo}.max_num_steps"),
    ("nv.dl.training.target.max_epochs", "{algo}.max_num_epochs"),
)

# Parallel sizes per policy backend: (tp, pp, cp, ep) keys under policy.<backend>.
_BACKEND_SIZES = {
    "megatron_cfg": ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
                     "expert_model_parallel_size"),
    "dtensor_cfg": ("tensor_parallel_size", "pipeline_parallel_size", "context_parallel_size",
                    "expert_parallel_size"),
}


def build_resource(*, service_name: str, run_id: str, algorithm: str | None, rank: int, world_size: int,
                   local_rank: int, span_groups: Iterable[str],
                   run_attributes: Mapping[str, Any] | None = None, fleet: str | None = None,
                   gpus: int | None = None, namespace: str | None = None) -> Resource:
    """The process's resource; these values win over ``OTEL_RESOURCE_ATTRIBUTES``.

    ``fleet`` and ``gpus`` are this process's own (``rl.fleet``, ``nv.dl.gpu.count``) and win over
    any inherited run attribute of the same name; None leaves the attribute out.
    """
    attributes: dict[str, object] = {
        **(run_attributes or {}),
        **software_versions(),
        "service.name": service_name,
        RUN_ID_KEY: run_id,
        "nv.dl.rank": int(rank),
        "nv.dl.world_size": int(world_size),
        "nv.dl.local_rank": int(local_rank),
        "process.pid": os.getpid(),
        "host.name": socket.gethostname(),
        SPAN_GROUPS_KEY: ",".join(sorted(span_groups)),
    }
    if algorithm:
        attributes["rl.algorithm"] = algorithm
    for key in (FLEET_KEY, GPU_COUNT_KEY):
        attributes.pop(key, None)  # per process: a driver's own never reaches its workers
    if fleet:
        attributes[FLEET_KEY] = fleet
    if gpus is not None:
        attributes[GPU_COUNT_KEY] = int(gpus)
    if namespace:
        attributes[NAMESPACE_KEY] = namespace.strip().lower()
    return Resource.create(attributes)


def fleet_for_role(role: str) -> str:
    """The fleet a ``traced_worker_init`` role serves: ``vllm`` is ``generation``, others keep their word."""
    word = str(role).strip().lower()
    return _ROLE_FLEETS.get(word, word)


def resolve_gpu_count(gpus: int | None = None, environ: Mapping[str, str] | None = None) -> int:
    """``nv.dl.gpu.count``: ``gpus`` if given, else the devices ``CUDA_VISIBLE_DEVICES`` lists, else
    ``len(ray.get_gpu_ids())`` inside a connected Ray process, else 0. A ``gpus`` that is not a
    count is warned about and resolved as if unset.

    ``CUDA_VISIBLE_DEVICES`` comes first because Ray sets it to a GPU worker's own devices; an
    empty value (or ``-1``, CUDA's "none") counts 0. Ray is only asked when this process has
    imported it already (a Ray worker has), so the lookup imports nothing. A process on a GPU
    machine with neither reads 0: pass ``gpus=`` there.
    """
    if gpus is not None:
        if not isinstance(gpus, bool) and isinstance(gpus, int) and gpus >= 0:
            return int(gpus)
        _log.warning("gpus=%r is not a GPU count (a non-negative integer); nv.dl.gpu.count is resolved "
                     "from the environment instead", gpus)
    environ = os.environ if environ is None else environ
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        devices = [d.strip() for d in visible.split(",") if d.strip()]
        # CUDA stops at the first invalid ordinal: "-1" (or "0,-1,2" after its first entry) hides the rest
        counted = 0
        for device in devices:
            if device.lstrip("-").isdigit() and int(device) < 0:
                break
            counted += 1
        return counted
    ray = sys.modules.get("ray")
    if ray is not None:
        try:
            if ray.is_initialized():
                return len(ray.get_gpu_ids())
        except Exception:  # a Ray half torn down must not stop telemetry from starting
            _log.debug("could not read ray.get_gpu_ids(); nv.dl.gpu.count falls back to 0", exc_info=True)
    return 0


def software_versions() -> dict[str, str]:
    """``nv.dl.software.*``: python's version and each installed package's (absent ones left out)."""
    from importlib import metadata

    versions = {"nv.dl.software.python": platform.python_version()}
    for key, distribution in SOFTWARE_PACKAGES.items():
        try:
            versions[f"nv.dl.software.{key}"] = metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
        except Exception:  # a broken install's metadata must not stop telemetry
            continue
    return versions


def _lookup(config: Mapping[str, Any], path: str) -> Any:
    node: Any = config
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def _scalar(value: Any) -> str | bool | int | float | None:
    """``value`` as an attribute value, or None for what an attribute cannot hold (a list, a dict)."""
    if isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    return None


def _size(value: Any, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        _log.warning("run config %s = %r is not a positive integer; nv.dl.topology.size.* leaves it out", what, value)
        return None
    return int(value)


def _parallel_sizes(policy: Mapping[str, Any]) -> dict[str, int]:
    """tp, pp, cp, ep of the policy backend in use (Megatron when enabled, else DTensor); 1 when unset."""
    megatron = policy.get("megatron_cfg")
    backend = "megatron_cfg" if isinstance(megatron, Mapping) and megatron.get("enabled") else "dtensor_cfg"
    section = policy.get(backend)
    section = section if isinstance(section, Mapping) else {}
    sizes = {}
    for short, key in zip(("tp", "pp", "cp", "ep"), _BACKEND_SIZES[backend]):
        size = _size(section.get(key, 1), f"policy.{backend}.{key}")
        if size is not None:
            sizes[short] = size
    return sizes


def _topology(config: Mapping[str, Any], placement: "_Placement | None") -> dict[str, int]:
    """``nv.dl.topology.size.*`` of the training fleet: the cluster less a split generation fleet."""
    policy = config.get("policy")
    sizes = _parallel_sizes(policy) if isinstance(policy, Mapping) else {}
    world = placement.training_gpus if placement is not None else _cluster_gpus(config)
    if placement is _UNPLACEABLE:
        world = None  # a split the config describes inconsistently: the training share is unknown
    if world is not None:
        sizes["world"] = world
        dp = _data_parallel(world, sizes.get("tp", 1) * sizes.get("pp", 1) * sizes.get("cp", 1), "nv.dl.topology")
        if dp is not None:
            sizes["dp"] = dp
    return {f"nv.dl.topology.size.{k}": v for k, v in sizes.items()}


def _cluster_gpus(config: Mapping[str, Any]) -> int | None:
    nodes = _size(_lookup(config, "cluster.num_nodes"), "cluster.num_nodes")
    gpus = _size(_lookup(config, "cluster.gpus_per_node"), "cluster.gpus_per_node")
    return nodes * gpus if nodes is not None and gpus is not None else None


def _data_parallel(world: int, model: int, prefix: str) -> int | None:
    if world % model == 0:
        return world // model
    _log.warning("run config: world size %d is not a multiple of tp*pp*cp = %d; %s.size.dp is left out",
                 world, model, prefix)
    return None


class _Placement:
    """Where generation runs, as NeMo-RL's GRPO setup reads ``policy.generation.colocated``.

    Colocated: generation shares the training GPUs. Split on one node: generation takes
    ``colocated.resources.gpus_per_node`` of its GPUs. Split on several nodes: generation takes
    ``colocated.resources.num_nodes`` whole nodes. Training keeps the rest.
    """

    def __init__(self, colocated: bool, nodes: int, gpus_per_node: int, training_gpus: int) -> None:
        self.colocated = colocated
        self.nodes = nodes
        self.gpus_per_node = gpus_per_node
        self.training_gpus = training_gpus


GENERATION_PREFIX = "rl.generation.topology"
_UNPLACEABLE = _Placement(False, 0, 0, 0)  # split, but colocated.resources does not say how


def _placement(config: Mapping[str, Any]) -> _Placement | None:
    """The generation fleet's GPUs: None where the config does not say, ``_UNPLACEABLE`` (warned
    about) where it says "split" without a share that leaves training some GPUs."""
    colocated = _lookup(config, "policy.generation.colocated.enabled")
    if not isinstance(colocated, bool):
        return None
    nodes = _size(_lookup(config, "cluster.num_nodes"), "cluster.num_nodes")
    per_node = _size(_lookup(config, "cluster.gpus_per_node"), "cluster.gpus_per_node")
    if nodes is None or per_node is None:
        return None
    if colocated:
        return _Placement(True, nodes, per_node, nodes * per_node)
    resources = _lookup(config, "policy.generation.colocated.resources")
    resources = resources if isinstance(resources, Mapping) else {}
    gen_nodes = _size(resources.get("num_nodes"), "policy.generation.colocated.resources.num_nodes")
    gen_per_node = _size(resources.get("gpus_per_node"), "policy.generation.colocated.resources.gpus_per_node")
    if nodes == 1:
        if gen_per_node is None or gen_per_node >= per_node or gen_nodes not in (None, 1):
            _log.warning("run config: generation is not colocated on one node, but colocated.resources "
                         "(gpus_per_node=%r, num_nodes=%r) does not leave training a share of its %d GPUs; "
                         "the fleets' topology sizes are left out", gen_per_node, gen_nodes, per_node)
            return _UNPLACEABLE
        return _Placement(False, 1, gen_per_node, per_node - gen_per_node)
    if gen_nodes is None or gen_nodes >= nodes or gen_per_node not in (None, per_node):
        _log.warning("run config: generation is not colocated on %d nodes, but colocated.resources "
                     "(num_nodes=%r, gpus_per_node=%r) does not take whole nodes and leave training some; "
                     "the fleets' topology sizes are left out", nodes, gen_nodes, gen_per_node)
        return _UNPLACEABLE
    return _Placement(False, gen_nodes, per_node, (nodes - gen_nodes) * per_node)


def _generation_attributes(config: Mapping[str, Any], placement: _Placement | None) -> dict[str, Any]:
    """``rl.generation.colocated`` and the generation fleet's ``rl.generation.topology.*`` sizes."""
    if placement is None or placement is _UNPLACEABLE:
        return {}
    attributes: dict[str, Any] = {
        "rl.generation.colocated": placement.colocated,
        f"{GENERATION_PREFIX}.num_nodes": placement.nodes,
        f"{GENERATION_PREFIX}.gpus_per_node": placement.gpus_per_node,
    }
    world = placement.nodes * placement.gpus_per_node
    attributes[f"{GENERATION_PREFIX}.size.world"] = world
    backend = _lookup(config, "policy.generation.backend")
    vllm = _lookup(config, "policy.generation.vllm_cfg")
    if backend not in (None, "vllm") or not isinstance(vllm, Mapping):
        return attributes  # a Megatron engine generates with the policy's own sizes
    sizes = {}
    for short, key in (("tp", "tensor_parallel_size"), ("pp", "pipeline_parallel_size"),
                       ("ep", "expert_parallel_size")):
        size = _size(vllm.get(key, 1), f"policy.generation.vllm_cfg.{key}")
        if size is not None:
            sizes[short] = size
    dp = _data_parallel(world, sizes.get("tp", 1) * sizes.get("pp", 1), GENERATION_PREFIX)
    if dp is not None:
        sizes["dp"] = dp
    attributes.update({f"{GENERATION_PREFIX}.size.{k}": v for k, v in sizes.items()})
    return attributes


def _provider_name(environ: Mapping[str, str]) -> str:
    """Who runs the job: the scheduler or orchestrator the process finds itself under."""
    if environ.get("SLURM_JOB_ID"):
        return "slurm"
    if environ.get("KUBERNETES_SERVICE_HOST"):
        return "kubernetes"
    return "local"


def run_resource_attributes(run_config: Mapping[str, Any] | None, *, algorithm: str | None = None,
                            environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The run's resource attributes derived from the trainer's whole config (NeMo-RL's shape).

    A pure function of its arguments (a missing key leaves its attribute out); see the table in
    docs/instrument.md ("Resource attributes") for where each attribute comes from.
    """
    config = run_config if isinstance(run_config, Mapping) else {}
    attributes: dict[str, Any] = {"nv.dl.provider.name": _provider_name(os.environ if environ is None else environ)}
    if algorithm:
        attributes["nv.dl.campaign.stage"] = _STAGES.get(algorithm.lower(), "RL")
    for name, path in (("rl.model", "policy.model_name"), ("nemo.precision", "policy.precision")):
        value = _scalar(_lookup(config, path))
        if value is not None:
            attributes[name] = value
    placement = _placement(config)
    attributes.update(_topology(config, placement))
    attributes.update(_generation_attributes(config, placement))
    section = _algorithm_section(config, algorithm)
    asynchronous = _lookup(section if section is not None else config.get("grpo") or {}, "async_grpo.enabled")
    if isinstance(asynchronous, bool):
        attributes["rl.async"] = asynchronous
    for name, path in _TRAINING_SETTINGS:
        if path.startswith("{algo}."):
            value = _lookup(section, path[len("{algo}."):]) if section is not None else None
        else:
            value = _lookup(config, path)
        value = _scalar(value)
        if value is not None:
            attributes[name] = value
    return attributes


def _algorithm_section(config: Mapping[str, Any], algorithm: str | None) -> Mapping[str, Any] | None:
    """The algorithm's own block: ``grpo:`` for grpo, ``sft:`` for sft_v2 (its name before ``_v<N>``)."""
    if not algorithm:
        return None
    for key in (algorithm, algorithm.lower().split("_v")[0]):
        section = config.get(key)
        if isinstance(section, Mapping):
            return section
    return None


def encode_run_attributes(attributes: Mapping[str, Any]) -> str:
    """JSON for ``NEMO_TELEMETRY_RESOURCE_ATTRIBUTES``; attributes past the size bound are left out."""
    kept: dict[str, Any] = {}
    for key, value in attributes.items():
        trial = json.dumps({**kept, key: value}, separators=(",", ":"))
        if len(trial.encode()) > MAX_RUN_ATTRIBUTES_BYTES:
            _log.warning("resource attribute %r does not fit in %d bytes of environment; workers do not get it",
                         key, MAX_RUN_ATTRIBUTES_BYTES)
            continue
        kept[key] = value
    return json.dumps(kept, separators=(",", ":"))


def decode_run_attributes(text: str | None) -> dict[str, Any]:
    """The attributes in ``NEMO_TELEMETRY_RESOURCE_ATTRIBUTES``; a bad value warns and gives none."""
    if not text:
        return {}
    try:
        if len(text.encode()) > MAX_RUN_ATTRIBUTES_BYTES:
            raise ValueError(f"longer than {MAX_RUN_ATTRIBUTES_BYTES} bytes")
        decoded = json.loads(text)
        if not isinstance(decoded, dict):
            raise ValueError("not a JSON object")
    except ValueError as exc:
        _log.warning("NEMO_TELEMETRY_RESOURCE_ATTRIBUTES is not usable (%s); the run's resource attributes "
                     "are left out of this process", exc)
        return {}
    return {str(k): v for k, v in decoded.items() if _scalar(v) is not None}
