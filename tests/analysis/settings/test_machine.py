"""ReadSettings is sized from the machine the process runs on: its CPU affinity (``taskset``), its
cgroup's CPU quota and memory limit (v1 and v2, read through /proc/self/cgroup and mountinfo), the
host's available memory; each overridden by an argument, then by its environment variable."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings

import pytest

from nemo_telemetry.analysis import ReadSettings, SettingsError
from nemo_telemetry.analysis.settings import machine
from nemo_telemetry.environment_variables import NEMO_TELEMETRY_MEMORY_BUDGET, NEMO_TELEMETRY_THREADS

GIB = 1 << 30
MIB = 1 << 20
HOST_AVAILABLE = 8 * GIB
AFFINITY = len(os.sched_getaffinity(0))


def _write(root, path: str, text: str) -> None:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)


def _host(root) -> None:
    _write(root, "/proc/meminfo", f"MemTotal:       16777216 kB\nMemFree:  1024 kB\n"
                                  f"MemAvailable:    {HOST_AVAILABLE >> 10} kB\n")


def _v2(root, *, path="/kubepods/pod1/ctr", mount_root="/", cpu_max=None, memory=None, parent_memory_max=None):
    """A cgroup v2 machine: this process in ``path``; ``memory``: (max, current, inactive_file)."""
    _host(root)
    _write(root, "/proc/self/cgroup", f"0::{path}\n")
    _write(root, "/proc/self/mountinfo",
           "22 1 0:21 / / rw,relatime - ext4 /dev/vda rw\n"
           f"30 25 0:26 {mount_root} /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n")
    folder = "/sys/fs/cgroup" + (path if mount_root == "/" else "")
    _write(root, f"{folder}/cpu.max", cpu_max or "max 100000\n")
    limit, current, inactive = memory or ("max", 300 * MIB, 0)
    _write(root, f"{folder}/memory.max", f"{limit}\n")
    _write(root, f"{folder}/memory.current", f"{current}\n")
    _write(root, f"{folder}/memory.stat", f"anon 1000\ninactive_file {inactive}\nactive_file 0\n")
    if parent_memory_max is not None:
        parent = folder.rsplit("/", 1)[0]
        _write(root, f"{parent}/memory.max", f"{parent_memory_max}\n")
        _write(root, f"{parent}/memory.current", f"{500 * MIB}\n")


def _v1(root, *, quota="-1", period="100000", limit="9223372036854771712", usage=str(300 * MIB), inactive=0):
    """A cgroup v1 machine as a Docker container sees it: its cgroup is the mount's root."""
    _host(root)
    _write(root, "/proc/self/cgroup", "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n1:name=systemd:/docker/abc\n")
    _write(root, "/proc/self/mountinfo",
           "31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755\n"
           "32 31 0:29 /docker/abc /sys/fs/cgroup/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct\n"
           "35 31 0:32 /docker/abc /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory\n")
    _write(root, "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", f"{quota}\n")
    _write(root, "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", f"{period}\n")
    _write(root, "/sys/fs/cgroup/memory/memory.limit_in_bytes", f"{limit}\n")
    _write(root, "/sys/fs/cgroup/memory/memory.usage_in_bytes", f"{usage}\n")
    _write(root, "/sys/fs/cgroup/memory/memory.stat", f"cache 0\ntotal_inactive_file {inactive}\n")


@pytest.fixture(autouse=True)
def _no_knobs(monkeypatch):
    monkeypatch.delenv(NEMO_TELEMETRY_THREADS, raising=False)
    monkeypatch.delenv(NEMO_TELEMETRY_MEMORY_BUDGET, raising=False)


def test_v2_unlimited_leaves_the_affinity_and_the_host_memory(tmp_path):
    _v2(tmp_path)
    assert machine.cpu_quota(root=tmp_path) is None
    assert machine.cgroup_memory_available(root=tmp_path) is None
    assert machine.available_cpus(root=tmp_path) == AFFINITY
    assert machine.memory_limit_bytes(root=tmp_path) == HOST_AVAILABLE
    assert ReadSettings.from_machine(root=tmp_path) == ReadSettings(threads=AFFINITY, memory_budget=HOST_AVAILABLE // 4)


def test_v2_limits_are_the_quota_and_the_room_under_memory_max(tmp_path):
    _v2(tmp_path, cpu_max="150000 100000\n", memory=(GIB, 400 * MIB, 100 * MIB))
    assert machine.cpu_quota(root=tmp_path) == 1.5
    assert machine.available_cpus(root=tmp_path) == 1  # 1.5 CPUs: a second thread would be throttled
    # 1 GiB limit, 400 MiB used of which 100 MiB inactive page cache the kernel reclaims first
    assert machine.cgroup_memory_available(root=tmp_path) == GIB - 300 * MIB
    settings = ReadSettings.from_machine(root=tmp_path)
    assert settings == ReadSettings(threads=1, memory_budget=(GIB - 300 * MIB) // 4)


def test_v2_a_parent_cgroup_with_less_room_is_the_limit(tmp_path):
    _v2(tmp_path, memory=("max", 100 * MIB, 0), parent_memory_max=2 * GIB)  # pod limit, container unlimited
    assert machine.cgroup_memory_available(root=tmp_path) == 2 * GIB - 500 * MIB


def test_v2_in_a_cgroup_namespace_reads_the_mount_itself(tmp_path):
    _v2(tmp_path, path="/", cpu_max="400000 100000\n", memory=(3 * GIB, GIB, 0))
    assert machine.cpu_quota(root=tmp_path) == 4.0
    assert machine.available_cpus(root=tmp_path) == min(AFFINITY, 4)
    assert machine.cgroup_memory_available(root=tmp_path) == 2 * GIB


def test_a_limit_above_the_hosts_available_memory_leaves_the_host_figure(tmp_path):
    _v2(tmp_path, memory=(64 * GIB, GIB, 0))
    assert machine.memory_limit_bytes(root=tmp_path) == HOST_AVAILABLE


def test_v1_unlimited(tmp_path):
    _v1(tmp_path)
    assert machine.cpu_quota(root=tmp_path) is None
    assert machine.cgroup_memory_available(root=tmp_path) is None
    assert ReadSettings.from_machine(root=tmp_path) == ReadSettings(threads=AFFINITY, memory_budget=HOST_AVAILABLE // 4)


def test_v1_limits(tmp_path):
    _v1(tmp_path, quota="50000", limit=str(2 * GIB), usage=str(GIB), inactive=256 * MIB)
    assert machine.cpu_quota(root=tmp_path) == 0.5
    assert machine.available_cpus(root=tmp_path) == 1  # never fewer than one
    assert machine.cgroup_memory_available(root=tmp_path) == GIB + 256 * MIB
    assert ReadSettings.from_machine(root=tmp_path).memory_budget == (GIB + 256 * MIB) // 4


def test_no_cgroup_and_no_meminfo_falls_back_to_physical_memory_then_says_so(tmp_path, monkeypatch):
    assert machine.cpu_quota(root=tmp_path) is None and machine.memory_limit_bytes(root=tmp_path) is None
    physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # physical memory is known here: no warning
        assert ReadSettings.from_machine(root=tmp_path).memory_budget == physical // 4

    def no_sysconf(name):
        raise ValueError(name)

    monkeypatch.setattr(machine.os, "sysconf", no_sysconf)  # a platform that tells nothing
    with pytest.warns(UserWarning, match="4 GiB.*NEMO_TELEMETRY_MEMORY_BUDGET"):
        assert ReadSettings.from_machine(root=tmp_path).memory_budget == machine.FALLBACK_MEMORY_BYTES // 4


def test_arguments_win_over_environment_over_machine(tmp_path, monkeypatch):
    _v2(tmp_path, cpu_max="150000 100000\n", memory=(GIB, 0, 0))
    monkeypatch.setenv(NEMO_TELEMETRY_THREADS, "3")
    monkeypatch.setenv(NEMO_TELEMETRY_MEMORY_BUDGET, "512M")
    assert ReadSettings.from_machine(root=tmp_path) == ReadSettings(threads=3, memory_budget=512 * MIB)
    assert ReadSettings.from_machine(threads=5, memory_budget="1.5G", batch_rows=1000, root=tmp_path) == \
        ReadSettings(threads=5, memory_budget=3 * GIB // 2, batch_rows=1000)
    assert ReadSettings.from_machine(memory_budget=12345, root=tmp_path).memory_budget == 12345


@pytest.mark.parametrize("text, size", [("4G", 4 * GIB), ("512MiB", 512 * MIB), ("1.5g", 3 * GIB // 2),
                                        ("1024", 1024), (" 64 kb ", 64 << 10), (2048, 2048), ("0", 0)])
def test_sizes(text, size):
    assert machine.parse_bytes(text) == size


@pytest.mark.parametrize("text", ["lots", "4X", "-1G", "", "1e9"])
def test_a_size_that_cannot_be_read_is_a_typed_error(text):
    with pytest.raises(SettingsError, match="memory budget"):
        machine.parse_bytes(text)


@pytest.mark.parametrize("value", ["0", "two", "-3", "1.5"])
def test_a_thread_count_that_cannot_be_read_is_a_typed_error(monkeypatch, value):
    monkeypatch.setenv(NEMO_TELEMETRY_THREADS, value)
    with pytest.raises(SettingsError, match=NEMO_TELEMETRY_THREADS):
        ReadSettings.from_machine()


@pytest.mark.skipif(shutil.which("taskset") is None or AFFINITY < 2, reason="needs taskset and two CPUs")
def test_taskset_to_one_cpu_sizes_every_thread_count_to_it():
    code = ("import json\n"
            "from nemo_telemetry.analysis import ReadSettings\n"
            "from nemo_telemetry.analysis.settings.machine import available_cpus\n"
            "from nemo_telemetry.analysis.ingestion.ingest import decode_threads, write_threads\n"
            "print(json.dumps([available_cpus(), ReadSettings.from_machine().threads, decode_threads(),\n"
            "                  write_threads()]))\n")
    env = {k: v for k, v in os.environ.items() if k != NEMO_TELEMETRY_THREADS}
    one = json.loads(subprocess.run(["taskset", "-c", "0", sys.executable, "-c", code], env=env,
                                    capture_output=True, text=True, check=True).stdout)
    every = json.loads(subprocess.run([sys.executable, "-c", code], env=env,
                                      capture_output=True, text=True, check=True).stdout)
    assert one[:2] == [1, 1]
    assert every[:2] == [machine.available_cpus()] * 2 and every[0] > 1
    # ingest keeps one batch decoding while the next is read, and one file writing, even on one CPU
    assert one[2:] == [2, 2] and every[2] == max(2, every[0])
