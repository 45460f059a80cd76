"""examples/quickstart.ipynb, executed in a real Jupyter kernel (nbclient, ipykernel): its
model and data are classes and functions of its cells, its DiLoCo run forks 4 ranks from
the kernel, and its sweep's figure is in the output cells. A cell added here checks that the
ranks are processes of their own which train a class defined in a cell. (The command in its
last Markdown cell runs in tests/test_readme.py.)"""
import ast
import json
import os

import pytest

from conftest import REPO

nbformat = pytest.importorskip("nbformat", reason="the dev extra (nbformat) is not installed")
nbclient = pytest.importorskip("nbclient", reason="the dev extra (nbclient) is not installed")
pytest.importorskip("ipykernel", reason="the dev extra (ipykernel) is not installed")

NOTEBOOK = REPO / "examples" / "quickstart.ipynb"

# Run after the notebook, in its kernel: a model class defined in a cell whose forward notes
# the process it trains in (while gradients are on: not the launcher's check of the model
# before it forks, nor validation in the evaluator); trained by 2 nodes, forked from the kernel.
# How many processes they train in is the run's placement (engine/plan/placement.py): on the
# CPU a process per node up to 4 per core and 32 in all, else nodes packed in fewer workers;
# the cell prints that count, read from the same function the run uses.
WHERE_RANKS_RUN = '''
import os

import torch
from exoframe.engine.plan.placement import nodes_per_process

NODES = 2

class Noted(Classifier):
    def forward(self, batch):
        if torch.is_grad_enabled():  # training
            with open(PIDS, "a") as f:
                f.write(f"{os.getpid()}\\n")
        return super().forward(batch)

exoframe.Trainer(Noted(), clusters(256, seed=1), clusters(64, seed=2), batch_size=32).fit(
    strategy="ddp", num_nodes=NODES, steps=2)
print(json.dumps({"kernel": os.getpid(), "ranks": sorted(set(open(PIDS).read().split())),
                  "processes": -(-NODES // nodes_per_process(NODES, None))}))
'''


def outputs(cell, kind):
    return [o for o in cell.get("outputs", []) if o["output_type"] == kind]


def test_the_quickstart_notebook_runs_in_a_kernel_and_shows_its_figure(tmp_path):
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    checks = nbformat.v4.new_code_cell(
        f"import json\nPIDS = {str(tmp_path / 'pids')!r}\n" + WHERE_RANKS_RUN)
    notebook.cells.append(checks)
    client = nbclient.NotebookClient(
        notebook, timeout=600, kernel_name="python3",  # a hang guard, not a speed limit
        resources={"metadata": {"path": str(tmp_path)}})
    client.execute(env={**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)})

    code = [c for c in notebook.cells if c.cell_type == "code"]
    for cell in code:
        assert not outputs(cell, "error"), cell["source"]
    printed = "".join(o["text"] for c in code for o in outputs(c, "stream"))
    assert "final validation loss" in printed and "simulated wall-clock" in printed, printed
    figures = [o for c in code for o in outputs(c, "display_data") if "image/png" in o["data"]]
    assert len(figures) == 1, "the sweep's plot is not in the output cells"
    swept = next(o for c in code for o in outputs(c, "execute_result")
                 if "'ddp'" in o["data"]["text/plain"])
    times = ast.literal_eval(swept["data"]["text/plain"])  # {strategy: seconds per bandwidth}
    assert times["ddp"][0] > times["ddp"][-1] > times["diloco"][-1], times
    where = json.loads(outputs(code[-1], "stream")[-1]["text"].strip().splitlines()[-1])
    # 2 nodes: a process each on any machine (placement packs nodes only past 4 per core)
    assert where["processes"] == 2, where
    assert len(where["ranks"]) == where["processes"], where  # every node trained, forked
    assert str(where["kernel"]) not in where["ranks"], where  # and none in the kernel
