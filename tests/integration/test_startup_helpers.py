"""traced_ray_init on a real Ray cluster: rl.setup.ray_init says where the cluster came from.

The session's cluster (``ray_cluster``) is reused in this process; a second process, given its
address, attaches to it. Spans are read back from the dump files of each process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from nemo_telemetry.analysis import read_spans
from nemo_telemetry.instrument import init_telemetry_driver, shutdown_telemetry, startup_span, traced_ray_init

pytestmark = pytest.mark.slow


def _ray_init_span(dump_dir) -> dict:
    rows = [r for r in read_spans(dump_dir).to_pylist() if r["name"] == "rl.setup.ray_init"]
    assert len(rows) == 1
    return rows[0]


def test_a_cluster_this_process_already_has_is_reused_local(ray_cluster, tmp_path):
    init_telemetry_driver({"enabled": True, "span_groups": "default", "exporter": "dump", "dump_dir": str(tmp_path)})
    with startup_span():
        assert traced_ray_init() == "reused_local"
    shutdown_telemetry(timeout_s=10)
    assert dict(_ray_init_span(tmp_path)["attributes"])["rl.ray.cluster_source"] == "reused_local"
    assert ray_cluster.is_initialized()


def test_a_process_given_the_clusters_address_is_attached_external(ray_cluster, tmp_path):
    address = ray_cluster.get_runtime_context().gcs_address
    script = textwrap.dedent(f"""
        from nemo_telemetry.instrument import init_telemetry_driver, shutdown_telemetry, traced_ray_init
        init_telemetry_driver({{"enabled": True, "span_groups": "setup", "exporter": "dump",
                               "dump_dir": {str(tmp_path)!r}}})
        source = traced_ray_init(address={address!r}, include_dashboard=False, log_to_driver=False,
                                 local_options={{"num_cpus": 1}})
        import ray
        ray.shutdown()
        shutdown_telemetry(timeout_s=10)
        print(source)
    """)
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("NEMO_TELEMETRY_", "OTEL_", "RAY_ADDRESS"))}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240, env=environ)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "attached_external"
    span = _ray_init_span(tmp_path)
    assert dict(span["attributes"])["rl.ray.cluster_source"] == "attached_external"
    assert span["status_code"] != "error"
