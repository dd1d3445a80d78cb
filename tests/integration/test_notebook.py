"""notebooks/goodput.ipynb runs top to bottom against a fresh demo run (nbclient, a real kernel).

The ``python3`` kernel is pinned to the interpreter running the tests: the test writes an
ipykernel kernelspec for ``sys.executable`` into a temporary directory first on ``JUPYTER_PATH``,
so a ``python3`` kernelspec installed elsewhere on the machine cannot run the notebook in an
interpreter without this package.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from ipykernel.kernelspec import write_kernel_spec
from nbclient import NotebookClient

from _demo_runs import demo_run

pytestmark = pytest.mark.slow

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "goodput.ipynb"


def _outputs(notebook, output_type=None, mime=None):
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            if output_type and output.get("output_type") != output_type:
                continue
            if mime and mime not in output.get("data", {}):
                continue
            yield output


def test_goodput_notebook_runs_against_a_demo_dataset(ray_cluster, tmp_path_factory, tmp_path, monkeypatch):
    result = demo_run(tmp_path_factory.getbasetemp(), mode="sync", steps=4)
    monkeypatch.setenv("NEMO_TELEMETRY_DATASET", str(result.out))  # a demo's --out dir is accepted
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    jupyter_path = tmp_path / "jupyter"
    write_kernel_spec(jupyter_path / "kernels" / "python3")  # argv[0] = sys.executable
    monkeypatch.setenv("JUPYTER_PATH", str(jupyter_path))
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(notebook, kernel_name="python3", timeout=180,
                            resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError on the first failing cell

    assert not list(_outputs(notebook, output_type="error"))
    text = "".join(o.get("text", "") for o in _outputs(notebook, output_type="stream"))
    assert str(result.dataset) in text and result.run_id in text
    figures = list(_outputs(notebook, mime="image/png"))
    assert len(figures) >= 4  # goodput per step, bucket share, GPU-seconds per fleet, the step's waterfall
    tables = "".join(o["data"].get("text/plain", "") for o in _outputs(notebook, output_type="execute_result"))
    tables += "".join(o["data"].get("text/plain", "") for o in _outputs(notebook, output_type="display_data"))
    assert "productive_s" in tables and "goodput" in tables
    assert "productive_gpu_s" in tables and "policy" in tables  # the fleet view: the demo declares its fleets
    assert "cluster:" in text


def test_notebook_uses_only_the_public_analysis_api():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    imports = [line.strip() for cell in notebook.cells if cell.cell_type == "code"
               for line in cell.source.splitlines() if "nemo_telemetry" in line and "import" in line]
    assert imports == ["from nemo_telemetry.analysis import check_run, read_metrics, read_spans, run_goodput, waterfall"]
    from nemo_telemetry import analysis

    assert {"check_run", "read_spans", "run_goodput", "waterfall"} <= set(analysis.__all__)
